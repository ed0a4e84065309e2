-- The inbox: the consumer's half of the outbox. The inbox replaces t_inbox and
-- t_inbox_rejected with the configured names.
--
-- t_inbox holds one row per event a consumer group has handled. Its primary key is the
-- duplicate check: the row is inserted in the handler's own transaction, before the
-- handler runs, so the handler's effect and the record commit together or not at all, and
-- a second delivery of the event (same group, same event id) fails the insert with a
-- duplicate key and is acknowledged without running the handler. A concurrent second
-- delivery waits on the first one's row lock and then finds the row (first committed) or
-- takes its place (first rolled back).
--
-- Groups are apart: each consumer group has its own effects, so (consumer_group, event_id)
-- is the key, never event_id alone. event_id is the outbox's UUIDv7 (the eventId message
-- property), which starts with the time: new keys go to the right-hand end of the index.
CREATE TABLE IF NOT EXISTS t_inbox (
    consumer_group VARCHAR(255) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_id       CHAR(36)     CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    consumed_at    DATETIME(3)  NOT NULL,
    PRIMARY KEY (consumer_group, event_id),
    -- retention deletes by age, oldest first, a batch at a time.
    KEY idx_consumed_at (consumed_at)
) ENGINE = InnoDB;

-- t_inbox_rejected holds the messages a consumer group can never process: one without an
-- event id, one the handler refused for good (a Permanent error), or one that failed its
-- last allowed delivery. Each is recorded with its reason, properties and body, and
-- acknowledged, so that RocketMQ does not deliver it again and again; an operator lists,
-- finds (Inbox.RejectedByEventID) and replays them (Inbox.Replay). msg_key is the event id,
-- or 'msgId:' and the broker's message id for a message without one: a message rejected
-- again adds a delivery, and uk_group_msg_key finds a message by its event id.
-- idx_group_id serves Inbox.Rejected's pages: a group's rows in id order from the page's
-- last id, so that a page reads its own rows only, never another group's (a table made
-- before it works without it, reading the others' rows of the range as well; see
-- docs/upgrading.md).
CREATE TABLE IF NOT EXISTS t_inbox_rejected (
    id             BIGINT        NOT NULL AUTO_INCREMENT,
    consumer_group VARCHAR(255)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    msg_key        VARCHAR(128)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    event_id       CHAR(36)      CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    msg_id         VARCHAR(128)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    topic          VARCHAR(255)  CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT '',
    reason_class   VARCHAR(32)   CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The reason (the handler's error) and the properties (a JSON object of the message's,
    -- the biz no among them) are any text: utf8mb4 whatever the database's default, which
    -- may be latin1, where a rejection of a message with a Chinese biz no would fail.
    reason         VARCHAR(1024) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    properties     TEXT          CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    body           MEDIUMBLOB    NOT NULL,
    deliveries     INT           NOT NULL DEFAULT 1,
    first_rejected DATETIME(3)   NOT NULL,
    last_rejected  DATETIME(3)   NOT NULL,
    PRIMARY KEY (id),
    UNIQUE KEY uk_group_msg_key (consumer_group, msg_key),
    KEY idx_group_id (consumer_group, id)
) ENGINE = InnoDB;
