-- One orchestrator per run: the process holding a run's Postgres advisory lock writes who it is
-- here, so a second orchestrator refused the run can name the holder.
CREATE TABLE IF NOT EXISTS run_leases (
    run_id      uuid PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    holder      text NOT NULL,
    acquired_at timestamptz NOT NULL DEFAULT now()
);
