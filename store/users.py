"""Accounts: a name, a role and a password hash (hashing itself is ui.auth's)."""

from dataclasses import dataclass

from store.db import Connection, StoreError

ROLES = ("annotator", "operator")


@dataclass(frozen=True)
class User:
    name: str
    role: str
    password_hash: str


def add_user(con: Connection, name: str, role: str, password_hash: str) -> None:
    if role not in ROLES:
        raise StoreError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if con.execute("SELECT 1 FROM users WHERE name = ?", [name]).fetchone():
        raise StoreError(f"a user named {name!r} exists already")
    con.execute("INSERT INTO users (name, role, password_hash) VALUES (?, ?, ?)", [name, role, password_hash])


def get_user(con: Connection, name: str) -> User | None:
    row = con.execute("SELECT name, role, password_hash FROM users WHERE name = ?", [name]).fetchone()
    return User(*row) if row else None


def set_password_hash(con: Connection, name: str, password_hash: str) -> None:
    con.execute("UPDATE users SET password_hash = ? WHERE name = ?", [password_hash, name])
