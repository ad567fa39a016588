-- The optimisation settings a run's trainer echoed back (the experiment's [trainer] table as
-- the trainer holds it) and their hash; every train step of the run carries that hash.
ALTER TABLE runs ADD COLUMN IF NOT EXISTS trainer_settings JSONB;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS trainer_settings_hash TEXT;
