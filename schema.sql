-- The outbox table. The publisher replaces the name t_event_record with the configured one.
-- Valid on MySQL 8 and MariaDB 10.5+.
--
-- Times are DATETIME(3) written by the database as UTC_TIMESTAMP(3): the database's clock,
-- read in UTC so that sessions with different time_zone settings agree on every lease.
CREATE TABLE IF NOT EXISTS t_event_record (
    id              BIGINT        NOT NULL AUTO_INCREMENT,
    biz_no          VARCHAR(64)   NOT NULL,
    event_type      VARCHAR(64)   NOT NULL,
    payload         MEDIUMBLOB    NOT NULL,
    -- WAIT -> SENDING -> SUCCESS, or back to WAIT for a retry, or FAIL (dead letter).
    status          VARCHAR(16)   NOT NULL DEFAULT 'WAIT',
    -- failed attempts so far; the last failure (past the retry limit) leaves MaxRetry+1.
    retry_count     INT           NOT NULL DEFAULT 0,
    -- a WAIT row is due once this has passed.
    next_retry_time DATETIME(3)   NOT NULL,
    -- the lease: who claimed the row and when. NULL unless SENDING.
    claim_owner     VARCHAR(128)  NULL,
    claimed_at      DATETIME(3)   NULL,
    -- why the last attempt failed.
    last_error      VARCHAR(1024) NULL,
    create_time     DATETIME(3)   NOT NULL,
    update_time     DATETIME(3)   NOT NULL,
    PRIMARY KEY (id),
    -- the candidate scan: status = 'WAIT' AND next_retry_time <= now, oldest first.
    KEY idx_status_next_retry (status, next_retry_time),
    -- the reclaim scan: status = 'SENDING' AND claimed_at < now - lease.
    KEY idx_status_claimed_at (status, claimed_at),
    -- lookups by business key, for people tracing an order's events.
    KEY idx_biz_no (biz_no)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4
