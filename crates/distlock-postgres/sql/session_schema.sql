-- The schema of session mode. The statements after the CREATEs bring a table of an older
-- version (one row per owner and kind, with a re-entry count) to one row per grant.
CREATE SEQUENCE IF NOT EXISTS dlock_fence_seq;
CREATE TABLE IF NOT EXISTS dlock_fence (
    ns text NOT NULL,
    name text NOT NULL,
    token bigint NOT NULL,
    PRIMARY KEY (ns, name)
);
CREATE TABLE IF NOT EXISTS dlock_holders (
    ns text NOT NULL,
    name text NOT NULL,
    attempt text NOT NULL,
    owner text NOT NULL,
    kind text NOT NULL,
    token bigint NOT NULL,
    pid integer NOT NULL,
    acquired_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (ns, name, attempt)
);
ALTER TABLE dlock_holders ADD COLUMN IF NOT EXISTS attempt text;
UPDATE dlock_holders SET attempt = 'legacy:' || owner || ':' || kind WHERE attempt IS NULL;
ALTER TABLE dlock_holders ALTER COLUMN attempt SET NOT NULL;
ALTER TABLE dlock_holders DROP COLUMN IF EXISTS count;
DO $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM pg_index i
        JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
        WHERE i.indrelid = 'dlock_holders'::regclass AND i.indisprimary AND a.attname = 'attempt'
    ) THEN
        ALTER TABLE dlock_holders DROP CONSTRAINT IF EXISTS dlock_holders_pkey;
        ALTER TABLE dlock_holders ADD PRIMARY KEY (ns, name, attempt);
    END IF;
END $$;
