"""Accounts: a name, a role, a password hash (hashing itself is ui.owner.auth's), and the log of every change."""

import re
from dataclasses import dataclass
from datetime import datetime

from store.db import Connection, StoreError, transaction

ROLES = ("annotator", "operator")
NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str
    disabled: bool = False


@dataclass(frozen=True)
class AccountEvent:
    at: datetime
    account: str
    action: str
    actor: str


def check_new_user(name: str, role: str) -> None:
    if not NAME.fullmatch(name):
        raise StoreError(f"user names use 1 to 64 letters, digits, '.', '_' or '-'; got {name!r}")
    if role not in ROLES:
        raise StoreError(f"role must be one of {', '.join(ROLES)}, got {role!r}")


def add_user(con: Connection, name: str, role: str, password_hash: str, actor: str, now: datetime) -> None:
    check_new_user(name, role)
    with transaction(con):
        if con.execute("SELECT 1 FROM users WHERE name = ?", [name]).fetchone():
            raise StoreError(f"a user named {name!r} exists already")
        con.execute("INSERT INTO users (name, role, password_hash) VALUES (?, ?, ?)", [name, role, password_hash])
        _log(con, name, f"added as {role}", actor, now)


def get_user(con: Connection, name: str) -> User | None:
    row = con.execute("SELECT name, role, password_hash, disabled FROM users WHERE name = ?", [name]).fetchone()
    return User(*row) if row else None


def list_users(con: Connection) -> list[User]:
    return [User(*row) for row in con.execute("SELECT name, role, password_hash, disabled FROM users ORDER BY name").fetchall()]


def set_disabled(con: Connection, name: str, disabled: bool, actor: str, now: datetime) -> None:
    with transaction(con):
        user = _existing(con, name)
        if user.disabled == disabled:
            raise StoreError(f"{name} is {'disabled' if disabled else 'enabled'} already")
        con.execute("UPDATE users SET disabled = ? WHERE name = ?", [disabled, name])
        if disabled:  # the pairs on the account's screen go back to the queue now, not when their leases run out
            con.execute("UPDATE assignments SET expires_at = ? WHERE annotator = ? AND closed_at IS NULL AND expires_at > ?",
                        [now, name, now])
        _log(con, name, "disabled" if disabled else "enabled", actor, now)


def set_password_hash(con: Connection, name: str, password_hash: str, actor: str, now: datetime, action: str = "password set") -> None:
    with transaction(con):
        _existing(con, name)
        con.execute("UPDATE users SET password_hash = ? WHERE name = ?", [password_hash, name])
        _log(con, name, action, actor, now)


def account_events(con: Connection, limit: int = 200) -> list[AccountEvent]:
    """The newest changes first."""
    if limit < 0:
        raise StoreError(f"the number of account changes to show must be 0 or more, got {limit}")
    rows = con.execute(
        "SELECT created_at, account, action, actor FROM account_events ORDER BY id DESC LIMIT ?", [limit]
    ).fetchall()
    return [AccountEvent(*row) for row in rows]


def _existing(con: Connection, name: str) -> User:
    user = get_user(con, name)
    if user is None:
        raise StoreError(f"no user named {name!r}")
    return user


def _log(con: Connection, account: str, action: str, actor: str, now: datetime) -> None:
    con.execute("INSERT INTO account_events (account, action, actor, created_at) VALUES (?, ?, ?, ?)", [account, action, actor, now])
