-- Table mode: the attempts that ended (gave up, released) after one of their requests went
-- unanswered, until `expires_at` (server clock): a late copy of such a request never grants
-- them. Written by the give-up or release in its transaction (after locking the lock's row),
-- read by an acquire after it locked the row; trimmed as it is written.
CREATE TABLE IF NOT EXISTS dlock_ended_attempts (
    attempt VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,
    lock_key CHAR(38) CHARACTER SET ascii NOT NULL,
    expires_at DATETIME(6) NOT NULL,
    KEY (expires_at)
) ENGINE=InnoDB
