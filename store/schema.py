"""The schema as numbered migrations; `store.db.migrate` applies the ones a database lacks.

A migration is never edited once released; change the schema by appending a new one.

No FOREIGN KEY constraints: DuckDB cannot alter a column of a table that a foreign key points
at, so a later migration could never change those tables. The store's functions keep references
whole instead, inside transactions.
"""

from typing import NamedTuple


class Migration(NamedTuple):
    version: int
    name: str
    sql: str


MIGRATIONS = [
    Migration(1, "initial schema", """
        CREATE SEQUENCE prompt_id;
        CREATE TABLE prompts (
            id INTEGER PRIMARY KEY DEFAULT nextval('prompt_id'),
            content_hash VARCHAR NOT NULL UNIQUE,   -- sha256 of the canonical messages JSON
            messages JSON NOT NULL,                 -- [{"role": ..., "content": ...}, ...]
            source VARCHAR NOT NULL,                -- the file it was imported from
            tags VARCHAR[] NOT NULL DEFAULT [],
            active BOOLEAN NOT NULL DEFAULT true,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        );

        CREATE TABLE policies (
            version INTEGER PRIMARY KEY,            -- 0 is the starting model
            parent INTEGER,
            adapter_path VARCHAR,                   -- NULL for version 0: the base model itself
            round INTEGER,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        );

        CREATE SEQUENCE completion_id;
        CREATE TABLE completions (
            id INTEGER PRIMARY KEY DEFAULT nextval('completion_id'),
            prompt_id INTEGER NOT NULL,
            policy_version INTEGER NOT NULL,
            text VARCHAR NOT NULL,
            token_count INTEGER NOT NULL,           -- generated tokens, the closing EOS included
            finished BOOLEAN NOT NULL,              -- ended with EOS rather than the length limit
            sampling JSON NOT NULL,                 -- temperature, top_p, top_k, max_new_tokens, seed
            reward DOUBLE,                          -- the latest reward model's normalised score
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        );
        CREATE INDEX completions_prompt ON completions (prompt_id, policy_version);

        CREATE SEQUENCE pair_id;
        CREATE TABLE pairs (
            id INTEGER PRIMARY KEY DEFAULT nextval('pair_id'),
            prompt_id INTEGER NOT NULL,
            completion_a INTEGER NOT NULL,
            completion_b INTEGER NOT NULL,
            strategy VARCHAR NOT NULL,              -- how the pair was built, e.g. 'same_policy'
            votes_wanted INTEGER NOT NULL DEFAULT 1,
            retired BOOLEAN NOT NULL DEFAULT false,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
            CHECK (completion_a <> completion_b)
        );

        CREATE TABLE users (
            name VARCHAR PRIMARY KEY,
            role VARCHAR NOT NULL CHECK (role IN ('annotator', 'operator')),
            password_hash VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        );

        CREATE SEQUENCE assignment_id;
        CREATE TABLE assignments (
            id INTEGER PRIMARY KEY DEFAULT nextval('assignment_id'),
            pair_id INTEGER NOT NULL,
            annotator VARCHAR NOT NULL,
            served_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
            shown_left INTEGER NOT NULL             -- the completion id shown on the left
        );

        CREATE SEQUENCE comparison_id;
        CREATE TABLE comparisons (
            id INTEGER PRIMARY KEY DEFAULT nextval('comparison_id'),
            pair_id INTEGER NOT NULL,
            annotator VARCHAR NOT NULL,
            choice VARCHAR NOT NULL CHECK (choice IN ('a', 'b', 'tie', 'both_bad')),
            strength VARCHAR CHECK (strength IN ('slight', 'much')),
            comment VARCHAR,
            elapsed_ms INTEGER,
            client_token VARCHAR UNIQUE,
            source VARCHAR NOT NULL DEFAULT 'app',  -- 'app', 'simulate' or 'import'
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        );

        CREATE TABLE skips (
            pair_id INTEGER NOT NULL,
            annotator VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
            PRIMARY KEY (pair_id, annotator)
        );

        CREATE TABLE snapshots (
            hash VARCHAR PRIMARY KEY,
            rows INTEGER NOT NULL,
            path VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        );

        CREATE TABLE reward_models (
            version INTEGER PRIMARY KEY,
            snapshot VARCHAR NOT NULL,
            adapter_path VARCHAR NOT NULL,
            metrics JSON NOT NULL,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp
        );

        CREATE SEQUENCE job_id;
        CREATE TABLE jobs (
            id INTEGER PRIMARY KEY DEFAULT nextval('job_id'),
            kind VARCHAR NOT NULL,
            status VARCHAR NOT NULL CHECK (status IN ('queued', 'running', 'done', 'failed', 'cancelled')),
            config JSON NOT NULL,
            progress DOUBLE NOT NULL DEFAULT 0,
            error VARCHAR,
            log_path VARCHAR,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
            finished_at TIMESTAMP
        );

        CREATE TABLE metrics (
            job_id INTEGER NOT NULL,
            step INTEGER NOT NULL,
            name VARCHAR NOT NULL,
            value DOUBLE NOT NULL
        );
    """),
    Migration(2, "queue leases, vote tokens, imported completions", """
        -- Imported preference data has completions that no policy version wrote, and whose
        -- token count and sampling are unknown: NULL in these columns.
        -- DuckDB cannot alter a column while an index covers its table, hence drop and remake.
        DROP INDEX completions_prompt;
        ALTER TABLE completions ALTER COLUMN policy_version DROP NOT NULL;
        ALTER TABLE completions ALTER COLUMN token_count DROP NOT NULL;
        ALTER TABLE completions ALTER COLUMN finished DROP NOT NULL;
        ALTER TABLE completions ALTER COLUMN sampling DROP NOT NULL;
        CREATE INDEX completions_prompt ON completions (prompt_id, policy_version);

        -- An assignment is one serving of a pair to one annotator: a lease until expires_at,
        -- closed by a vote or a skip. Its token is the client token its vote carries.
        ALTER TABLE assignments ADD COLUMN token VARCHAR;
        ALTER TABLE assignments ADD COLUMN expires_at TIMESTAMP;
        ALTER TABLE assignments ADD COLUMN closed_at TIMESTAMP;
        CREATE UNIQUE INDEX assignments_token ON assignments (token);
        CREATE INDEX assignments_annotator ON assignments (annotator, pair_id);

        CREATE UNIQUE INDEX comparisons_pair_annotator ON comparisons (pair_id, annotator);
    """),
    Migration(3, "training rounds", """
        -- A round: reward model, PPO from the newest policy, then completions of the new policy
        -- against the old on held-back prompts. Its jobs point at it; the ingesters fill in the
        -- versions it produced in the same transaction that registers them.
        CREATE SEQUENCE round_id;
        CREATE TABLE rounds (
            id INTEGER PRIMARY KEY DEFAULT nextval('round_id'),
            status VARCHAR NOT NULL CHECK (status IN ('running', 'done', 'failed', 'cancelled')),
            policy_from INTEGER NOT NULL,
            reward_version INTEGER,             -- trained in the round, or chosen when it started
            policy_to INTEGER,
            comparisons_at_start INTEGER NOT NULL,  -- for the scheduler: rounds every N new comparisons
            error VARCHAR,
            created_at TIMESTAMP NOT NULL DEFAULT current_timestamp,
            finished_at TIMESTAMP
        );
        ALTER TABLE jobs ADD COLUMN round INTEGER;
    """),
    Migration(4, "policy rollbacks", """
        -- A rollback registers a new policy version that copies an earlier one (its parent), so
        -- the next round starts from it and nothing is deleted. This column keeps the version
        -- that was newest when it was made, the one given up; NULL for every other version.
        ALTER TABLE policies ADD COLUMN rollback_from INTEGER;
    """),
    Migration(5, "disabled accounts and the account log", """
        -- A disabled account cannot sign in, and its open sessions are refused. Accounts are
        -- never deleted: their votes name them.
        ALTER TABLE users ADD COLUMN disabled BOOLEAN NOT NULL DEFAULT false;
        -- Every change to an account: who made it, what it was, when.
        CREATE SEQUENCE account_event_id;
        CREATE TABLE account_events (
            id INTEGER PRIMARY KEY DEFAULT nextval('account_event_id'),
            account VARCHAR NOT NULL,
            action VARCHAR NOT NULL,                -- 'added as <role>', 'disabled', 'enabled', 'password set', ...
            actor VARCHAR NOT NULL,                 -- an operator's name, or 'NAME (command line)'
            created_at TIMESTAMP NOT NULL
        );
    """),
    Migration(6, "the optimiser of each round", """
        -- 'ppo', 'dpo' or 'grpo': which job follows a round's reward model, and what its history shows.
        ALTER TABLE rounds ADD COLUMN optimizer VARCHAR NOT NULL DEFAULT 'ppo';
    """),
    Migration(7, "the reward model's heads on completions", """
        -- Each head's raw score of a completion by the latest reward model, beside their normalised
        -- mean in reward: the 'active' queue serves first the pairs whose heads disagree most.
        DROP INDEX completions_prompt;
        ALTER TABLE completions ADD COLUMN reward_heads DOUBLE[];
        CREATE INDEX completions_prompt ON completions (prompt_id, policy_version);
    """),
    Migration(8, "gold pairs", """
        -- A pair whose better answer is known: mixed into annotators' queues ([queue] gold_share), so that each
        -- annotator's answers on it measure their reliability. Served to everyone once, so its own votes_wanted
        -- is met when it is marked: the ordinary queue never serves it.
        CREATE TABLE gold (
            pair_id INTEGER PRIMARY KEY,
            answer VARCHAR NOT NULL CHECK (answer IN ('a', 'b')),
            origin VARCHAR NOT NULL,                -- 'import' (a gold file), 'agreed' (unanimous votes) or 'operator'
            marked_by VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL
        );
    """),
    Migration(9, "ranking tasks and rankings", """
        -- A task of K answers to one prompt ([queue] answers_per_task > 2) is served as one pair, its lead, which
        -- lists the answers; every other two of them is a pair of the task (votes_wanted 0: never served), so a
        -- ranking's pairwise outcomes are ordinary comparisons, and agreement, ratings, training and the
        -- export read them as votes.
        ALTER TABLE pairs ADD COLUMN answers INTEGER[];   -- the lead's: the task's completions; NULL for every other pair
        ALTER TABLE pairs ADD COLUMN task INTEGER;        -- the lead pair's id, for the task's other pairs; NULL otherwise

        -- One annotator's ranking of a task, stored once; its pairs are comparisons written in the same transaction.
        CREATE SEQUENCE ranking_id;
        CREATE TABLE rankings (
            id INTEGER PRIMARY KEY DEFAULT nextval('ranking_id'),
            pair_id INTEGER NOT NULL,               -- the task's lead pair
            prompt_id INTEGER NOT NULL,
            annotator VARCHAR NOT NULL,
            completion_ids INTEGER[] NOT NULL,      -- best first
            ranks INTEGER[] NOT NULL,               -- each completion's rank, 1 the best; equal ranks are a tie
            elapsed_ms INTEGER,
            client_token VARCHAR UNIQUE,
            source VARCHAR NOT NULL,
            created_at TIMESTAMP NOT NULL,
            UNIQUE (pair_id, annotator)
        );
    """),
    Migration(10, "why a round ran as it did", """
        -- What a round decided on its own, in words: which optimiser [round] optimizer = 'auto' chose and why, or
        -- the reward model it reused because the votes held nothing new for one. NULL when it decided nothing.
        ALTER TABLE rounds ADD COLUMN note VARCHAR;
    """),
    Migration(11, "a round's candidates", """
        -- The policies a round trained from its start, one a job, and their average (made by the predict job,
        -- optimizer 'average'), with the predictor's verdict on each: its win rate over the start by the reward model
        -- on fresh answers to held-back prompts, with its interval, its KL to v0, and whether the round registered
        -- it; a round registers one at most, or none.
        CREATE TABLE candidates (
            round INTEGER NOT NULL,
            job INTEGER NOT NULL,
            optimizer VARCHAR NOT NULL,
            seed INTEGER,                           -- NULL for the average
            win_rate DOUBLE,                        -- NULL until the predictor has run
            low DOUBLE,
            high DOUBLE,
            kl_to_v0 DOUBLE,
            ended DOUBLE,
            answers INTEGER,
            chosen BOOLEAN NOT NULL DEFAULT false,
            verdict VARCHAR,                        -- why it was chosen or not, in words
            PRIMARY KEY (round, job)
        );
        -- The job whose adapter a version is: with candidates, a round has several policy jobs and registers one.
        ALTER TABLE policies ADD COLUMN job INTEGER;
    """),
    Migration(12, "the files of registered versions", """
        -- The sha256 of each file of a policy or reward-model version's directory as it was registered, by the
        -- directory's path in the project: `tether check` finds a file changed or lost since.
        CREATE TABLE version_files (
            adapter_path VARCHAR NOT NULL,
            file VARCHAR NOT NULL,                  -- relative to adapter_path
            sha256 VARCHAR NOT NULL,
            PRIMARY KEY (adapter_path, file)
        );
    """),
    Migration(13, "a round's stage", """
        -- The stage a round is at (store.rounds.Stage; store.rounds.TRANSITIONS says which may follow which), and
        -- whether [round] optimizer = "auto" chose its optimiser. status stays, written with the stage: running
        -- until the stage is one of the finished ones, then that one. A running round's stage is read from its newest
        -- job; one with none is failed at the next start (fail_interrupted_rounds).
        CREATE TYPE round_stage AS ENUM ('reward_model', 'candidates', 'predictor', 'start_answers', 'pairs',
                                         'done', 'failed', 'cancelled');
        ALTER TABLE rounds ADD COLUMN stage round_stage NOT NULL DEFAULT 'reward_model';
        UPDATE rounds SET stage = CASE
            WHEN status <> 'running' THEN status
            ELSE coalesce((
                SELECT CASE
                    WHEN j.kind = 'reward_model' THEN 'reward_model'
                    WHEN j.kind = 'predict' THEN 'predictor'
                    WHEN j.kind = 'generate' AND (j.config->>'policy_version')::INTEGER = rounds.policy_from THEN 'start_answers'
                    WHEN j.kind = 'generate' THEN 'pairs'
                    ELSE 'candidates' END
                FROM jobs j WHERE j.round = rounds.id ORDER BY j.id DESC LIMIT 1), 'reward_model')
            END;
        ALTER TABLE rounds ADD COLUMN chosen_by_auto BOOLEAN NOT NULL DEFAULT false;
        -- Before this column, what 'auto' chose was said in the note, beginning "auto: ".
        UPDATE rounds SET chosen_by_auto = coalesce(note LIKE '%auto: %', false);
    """),
]
