"""Passwords (salted scrypt) and sign-in limits that hold when guesses come in parallel."""

import asyncio
import contextvars
import hashlib
import hmac
import secrets
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from functools import cache

# OWASP's scrypt parameters for passwords (N = 2^17, r = 8, p = 1): 128 MiB and a few hundred ms a hash.
_N, _R, _P = 2**17, 8, 1
_MAX_MEMORY = 2 * 128 * _R * _N  # hashlib refuses above 32 MiB unless told
MIN_PASSWORD_CHARS = 8


class WeakPassword(ValueError):
    """A new password that is too short."""


def hash_new_password(password: str) -> str:
    if len(password) < MIN_PASSWORD_CHARS:
        raise WeakPassword(f"the password must have at least {MIN_PASSWORD_CHARS} characters")
    return hash_password(password)


def hash_password(password: str) -> str:
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=_N, r=_R, p=_P, maxmem=_MAX_MEMORY)
    return f"scrypt${_N}${_R}${_P}${salt.hex()}${digest.hex()}"


def verify_password(password: str, stored: str) -> bool:
    try:
        scheme, n, r, p, salt, digest = stored.split("$")
    except ValueError:
        return False
    if scheme != "scrypt":
        return False
    n, r, p = int(n), int(r), int(p)
    candidate = hashlib.scrypt(password.encode(), salt=bytes.fromhex(salt), n=n, r=r, p=p, maxmem=max(_MAX_MEMORY, 2 * 128 * r * n))
    return hmac.compare_digest(candidate, bytes.fromhex(digest))


def is_outdated(stored: str) -> bool:
    """Whether a hash was made with other parameters than hash_password's: it is replaced at the next good sign-in."""
    return stored.split("$")[1:4] != [str(_N), str(_R), str(_P)]


@cache
def _dummy_hash() -> str:
    """Unknown names are checked against this, so they take as long as wrong passwords."""
    return hash_password(secrets.token_urlsafe(16))


# The caller's address, which Gradio does not pass to its auth function; set by ClientAddress.
client_address: contextvars.ContextVar[str] = contextvars.ContextVar("client_address", default="unknown")


class ClientAddress:
    """ASGI middleware that records each request's client address for the sign-in limits.

    Behind a reverse proxy on the same machine, uvicorn has already put the X-Forwarded-For
    address in its place (FORWARDED_ALLOW_IPS says which proxies it trusts).
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("client"):
            client_address.set(scope["client"][0])
        await self.app(scope, receive, send)


class Sessions(MutableMapping[str, str]):
    """The web server's session cookies and their account names (Gradio keeps them as its app's `tokens`).

    Each ends `max_age` seconds after its sign-in: from then on it is as if it had never been.
    A sign-in sweeps out those that ended, so the table holds only the live ones and the latest.
    """

    def __init__(self, max_age: float):
        self.max_age = max_age
        self._sessions: dict[str, tuple[str, float]] = {}  # token: account, signed in at
        self._lock = threading.Lock()  # Gradio's event loop signs in; the account views' threads end sessions

    def _live(self, signed_in_at: float) -> bool:
        return time.monotonic() - signed_in_at < self.max_age

    def __getitem__(self, token: str) -> str:
        with self._lock:
            account, signed_in_at = self._sessions[token]
            if not self._live(signed_in_at):
                del self._sessions[token]
                raise KeyError(token)
            return account

    def __setitem__(self, token: str, account: str) -> None:
        with self._lock:
            self._sessions = {t: s for t, s in self._sessions.items() if self._live(s[1])}
            self._sessions[token] = account, time.monotonic()

    def __delitem__(self, token: str) -> None:
        with self._lock:
            del self._sessions[token]

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter([t for t, (_, signed_in_at) in self._sessions.items() if self._live(signed_in_at)])

    def __len__(self) -> int:
        return len(list(iter(self)))

    def end(self, account: str) -> None:
        """End every session of this account, as Gradio's own log-out from all sessions does."""
        with self._lock:
            self._sessions = {t: s for t, s in self._sessions.items() if s[0] != account}


@dataclass
class SignInLimits:
    per_account: int = 5  # failed sign-ins on one account before it is locked
    per_address: int = 50  # failed sign-ins from one client address, on any accounts, before it is locked
    lockout_seconds: float = 60.0  # the first lockout; each next one of the same account or address doubles
    max_lockout_seconds: float = 900.0
    tracked: int = 10_000  # accounts and addresses remembered of each; the least recently failed are forgotten first


@dataclass
class _Record:
    failures: int = 0
    checking: int = 0  # attempts whose password is being hashed now
    lockouts: int = 0
    locked_until: float = 0.0
    last_failure: float = 0.0


class _Counter:
    """Failed sign-ins per key (an account name or a client address), in a table of bounded size."""

    def __init__(self, limit: int, limits: SignInLimits):
        self.limit, self.limits = limit, limits
        self.records: OrderedDict[str, _Record] = OrderedDict()

    def locked_for(self, key: str) -> float:
        """Seconds until `key` may try again; 0 when it may now."""
        record = self.records.get(key)
        if record is None:
            return 0.0
        now = time.monotonic()
        if now < record.locked_until:
            return record.locked_until - now
        if record.failures and now - record.last_failure > self.limits.max_lockout_seconds:
            record.failures = 0  # old mistakes are forgiven
        # Attempts still being checked count already, so parallel guesses cannot pass the limit.
        return self.limits.lockout_seconds if record.failures + record.checking >= self.limit else 0.0

    def begin(self, key: str) -> None:
        self._record(key).checking += 1

    def end(self, key: str, failed: bool) -> None:
        record = self._record(key)
        record.checking = max(0, record.checking - 1)  # its record may have been forgotten meanwhile
        if not failed:
            return
        record.failures += 1
        record.last_failure = time.monotonic()
        if record.failures >= self.limit:
            record.lockouts += 1
            record.locked_until = record.last_failure + min(
                self.limits.lockout_seconds * 2 ** (record.lockouts - 1), self.limits.max_lockout_seconds
            )
            record.failures = 0

    def forget(self, key: str) -> None:
        record = self.records.get(key)
        if record is not None and record.checking == 0:
            del self.records[key]

    def _record(self, key: str) -> _Record:
        record = self.records.pop(key, None) or _Record()
        self.records[key] = record  # the most recently used last
        while len(self.records) > self.limits.tracked:
            self.records.popitem(last=False)
        return record


class SignInGuard:
    """Checks passwords, refusing at once and without hashing while an account or an address is locked out.

    Each attempt is counted before its password is hashed, so guesses sent in parallel are held
    to the same limits as guesses sent one by one: at most `per_account` hashes per account per
    lockout. Every attempt is logged with its account, address and outcome.
    """

    def __init__(
        self,
        password_hash_of: Callable[[str], str | None],
        replace_hash: Callable[[str, str], None],
        limits: SignInLimits,
    ):
        self.password_hash_of, self.replace_hash, self.limits = password_hash_of, replace_hash, limits
        self.accounts = _Counter(limits.per_account, limits)
        self.addresses = _Counter(limits.per_address, limits)

    async def check(self, name: str, password: str) -> bool:
        # A plain `async def` method: Gradio awaits auth only when inspect.iscoroutinefunction says so.
        # Everything up to the first await runs at once on Gradio's one event loop, so counting is
        # race-free; hashing goes to a thread and blocks no one.
        address = client_address.get()
        wait = max(self.accounts.locked_for(name), self.addresses.locked_for(address))
        if wait:
            _log(f"sign-in refused for {name!r} from {address}: locked out for {wait:.0f} s more (no password checked)")
            return False
        self.accounts.begin(name)
        self.addresses.begin(address)
        ok = False
        try:
            stored = await asyncio.to_thread(self.password_hash_of, name)
            ok = await asyncio.to_thread(verify_password, password, stored or _dummy_hash()) and stored is not None
        finally:
            self.accounts.end(name, failed=not ok)
            self.addresses.end(address, failed=not ok)
        if not ok:
            _log(f"sign-in failed for {name!r} from {address} (password checked)")
            return False
        self.accounts.forget(name)
        if is_outdated(stored):
            await asyncio.to_thread(self.replace_hash, name, await asyncio.to_thread(hash_password, password))
        return True


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
