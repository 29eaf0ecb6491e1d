"""Commands that change a project while `tether serve` runs go through the server.

DuckDB lets one process open the database, and while the app runs that process is the
server: the database's one writer. At start it writes tether.server.json beside the database,
with its address and a secret token, readable by its owner only. `tether users ...` and
`tether backup` read that file and send their action to the server, which runs it on its own
connection. With no server running they open the database themselves and run the same action.
"""

import asyncio
import dataclasses
import getpass
import inspect
import ipaddress
import json
import os
import secrets
from pathlib import Path
from typing import Any, Callable

import httpx

from store.db import Connection, StoreError, utcnow
from store.users import account_events, add_user, list_users, set_disabled, set_password_hash
from train.common.files import write_durably
from ui.owner.backup import backup
from ui.owner.check import check_project
from ui.owner.project import Project

SERVER_FILE = "tether.server.json"
ROUTE = "/tether/control/{action}"


def command_line_actor() -> str:
    return f"{getpass.getuser()} (command line)"


# Each action runs on a database connection and returns what can travel as JSON.
def _users(con: Connection, project: Project) -> list[dict]:
    return [{"name": u.name, "role": u.role, "disabled": u.disabled} for u in list_users(con)]


def _account_log(con: Connection, project: Project, limit: int) -> list[dict]:
    return [{"at": e.at.isoformat(sep=" ", timespec="seconds"), "account": e.account, "action": e.action, "actor": e.actor}
            for e in account_events(con, limit)]


def _add_user(con: Connection, project: Project, name: str, role: str, password_hash: str, actor: str) -> None:
    add_user(con, name, role, password_hash, actor, utcnow())


def _set_disabled(con: Connection, project: Project, name: str, disabled: bool, actor: str) -> None:
    set_disabled(con, name, disabled, actor, utcnow())


def _set_password(con: Connection, project: Project, name: str, password_hash: str, actor: str) -> None:
    set_password_hash(con, name, password_hash, actor, utcnow())


def _check(con: Connection, project: Project) -> dict:
    return dataclasses.asdict(check_project(con, project))


def _backup(con: Connection, project: Project, dest: str) -> dict:
    taken = backup(con, project.root, Path(dest))
    return {"votes": taken.votes, "adapters": taken.adapters}


ACTIONS: dict[str, Callable[..., Any]] = {
    "users": _users,
    "account_log": _account_log,
    "add_user": _add_user,
    "set_disabled": _set_disabled,
    "set_password": _set_password,
    "backup": _backup,
    "check": _check,
}
# Actions on the running server's own state, with no database-only form.
SERVER_ACTIONS: dict[str, Callable[[Any], Any]] = {
    "check_queue": lambda server: server.check_queue(),
}
# Actions that need no lock (Server.control_action): they read a snapshot of their own, so votes go on meanwhile.
SNAPSHOT_ACTIONS = {"backup", "check"}
# Actions on an account (their first argument) after which it must sign in again.
ACCOUNT_ACTIONS = {"set_disabled", "set_password"}


def run_action(project: Project, action: str, *args: Any) -> Any:
    """Run an action through the running server if there is one, or on the database directly."""
    server = _running_server(project)
    if server is None and action in SERVER_ACTIONS:
        raise StoreError(f"no server is running for {project.root}")
    if server is None:
        return project.run(lambda con: ACTIONS[action](con, project, *args))
    try:
        reply = httpx.post(server["url"].rstrip("/") + ROUTE.format(action=action), json=list(args),
                           headers={"Authorization": f"Bearer {server['token']}"}, timeout=None)
    except httpx.TransportError as e:
        raise StoreError(f"the server (process {server['pid']}) holds the project but did not answer at {server['url']}: {e}") from None
    if reply.status_code != 200:
        raise StoreError(reply.json().get("error", reply.text) if reply.headers.get("content-type") == "application/json" else reply.text)
    return reply.json()


def _running_server(project: Project) -> dict | None:
    try:
        server = json.loads((project.root / SERVER_FILE).read_text())
        os.kill(server["pid"], 0)
    except (OSError, ValueError, KeyError):
        return None  # no server, or the file of one that was killed
    return server


def announce(project: Project, url: str, token: str) -> None:
    """Write the server file for this process: where it listens, and the token requests must carry."""
    write_durably(project.root / SERVER_FILE, json.dumps({"url": url, "pid": os.getpid(), "token": token}), mode=0o600)


def withdraw(project: Project) -> None:
    try:
        if json.loads((project.root / SERVER_FILE).read_text()).get("pid") == os.getpid():
            (project.root / SERVER_FILE).unlink()
    except (OSError, ValueError):
        pass


def from_this_machine(client: str | None, local: str | None) -> bool:
    """Whether a connection's client address is this machine's own: a loopback address, or the address it came in on.

    The second is how `tether` commands reach a server listening on one outside address only; no
    other machine can complete a connection from an address of ours. A reverse proxy on this
    machine must name its client (X-Forwarded-For), as it must for the sign-in limits.
    """
    try:
        address = ipaddress.ip_address(client or "")
    except ValueError:
        return False
    address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:127.0.0.1 on a dual-stack socket
    return address.is_loopback or client == local


def _check_arguments(action: Callable[..., Any], args: list) -> None:
    """A TypeError unless `args` are what the action takes after its connection and project, each of its type, and
    each int one the database can hold (JSON's numbers have no bounds, and DuckDB's BIGINT failed on 2**63)."""
    signature = inspect.signature(action)
    signature.bind(None, None, *args)
    for parameter, value in zip(list(signature.parameters.values())[2:], args):
        if type(value) is not parameter.annotation:  # bool is no int here, nor 1 a bool
            raise TypeError(f"{parameter.name} must be {parameter.annotation.__name__}, not {type(value).__name__}")
        if type(value) is int and not -(2**63) <= value < 2**63:
            raise TypeError(f"{parameter.name} must be an int of 64 bits")


def routes(server: Any) -> list:
    """The server's end: one POST route, for this machine only, that checks the token and runs the action."""
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def control(request: Request) -> JSONResponse:
        if not from_this_machine(request.client and request.client.host, (request.scope.get("server") or (None,))[0]):
            return JSONResponse({"error": "the control route answers this machine only"}, status_code=403)
        given = request.headers.get("authorization", "").removeprefix("Bearer ")
        if not secrets.compare_digest(given.encode(), server.control_token.encode()):
            return JSONResponse({"error": "not allowed"}, status_code=403)
        action = request.path_params["action"]
        if action in SERVER_ACTIONS:
            return JSONResponse(await asyncio.to_thread(SERVER_ACTIONS[action], server))
        if action not in ACTIONS:
            return JSONResponse({"error": f"no action {action!r}"}, status_code=404)
        try:
            args = await request.json()
            if not isinstance(args, list):
                raise ValueError("not a list")
            _check_arguments(ACTIONS[action], args)
        except (ValueError, TypeError) as e:
            return JSONResponse({"error": f"the body must be a JSON list of {action}'s arguments: {e}"}, status_code=400)
        try:
            result = await asyncio.to_thread(server.control_action, action, *args)
        except StoreError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        return JSONResponse(result)

    return [Route(ROUTE, control, methods=["POST"])]
