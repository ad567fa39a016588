-- Time a DeepRubric tree spent writing its nodes to Postgres (BENCHMARKS.md reports it per tree).
ALTER TABLE dr_trees ADD COLUMN db_seconds double precision NOT NULL DEFAULT 0;
