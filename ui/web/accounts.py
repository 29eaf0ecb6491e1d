"""The Accounts view: add accounts, disable and enable them, set their passwords, and the log of changes."""

import gradio as gr

from store.users import ROLES, account_events, list_users
from ui.owner.auth import hash_new_password
from ui.owner.server import Server
from ui.web.common import refused, user_errors, with_error_ids


def build_accounts(server: Server) -> None:
    """Each change is one of the owner's control actions, as `tether users` sends them to a running server."""

    @with_error_ids
    def accounts(request: gr.Request) -> tuple:
        """Every account, and the newest changes to them."""
        server.operator(request.username)
        users = [[u.name, u.role, "disabled" if u.disabled else "active"] for u in server.db(list_users)]
        log = [[e.at.strftime("%Y-%m-%d %H:%M:%S"), e.account, e.action, e.actor] for e in server.db(account_events, 200)]
        return users, log

    def changed(message: str, request: gr.Request) -> tuple:
        # The password box is emptied after every action, so it is not sent twice by mistake.
        return message, "", *accounts(request)

    @with_error_ids
    def add_account(name: str, role: str, password: str, request: gr.Request) -> tuple:
        operator = server.operator(request.username)
        with user_errors():
            server.control_action("add_user", name.strip(), role, hash_new_password(password), operator.name)
        return changed(f"Added {role} {name.strip()}.", request)

    @with_error_ids
    def disable_account(name: str, request: gr.Request) -> tuple:
        operator = server.operator(request.username)
        if name.strip() == operator.name:
            raise refused("You cannot disable your own account.")
        with user_errors():
            server.control_action("set_disabled", name.strip(), True, operator.name)
        return changed(f"Disabled {name.strip()}: its open sessions have ended.", request)

    @with_error_ids
    def enable_account(name: str, request: gr.Request) -> tuple:
        operator = server.operator(request.username)
        with user_errors():
            server.control_action("set_disabled", name.strip(), False, operator.name)
        return changed(f"Enabled {name.strip()}.", request)

    @with_error_ids
    def set_account_password(name: str, password: str, request: gr.Request) -> tuple:
        operator = server.operator(request.username)
        with user_errors():
            server.control_action("set_password", name.strip(), hash_new_password(password), operator.name)
        return changed(f"Set a new password for {name.strip()}.", request)

    with gr.Tab("Accounts") as tab:
        with gr.Row():
            name = gr.Textbox(label="Account name", max_lines=1)
            role = gr.Radio(list(ROLES), value="annotator", label="Role (for a new account)")
            password = gr.Textbox(label="Password (for a new account or a new password)", type="password", max_lines=1)
        with gr.Row():
            add = gr.Button("Add account", variant="primary")
            set_password = gr.Button("Set password")
            enable = gr.Button("Enable")
            disable = gr.Button("Disable", variant="stop")
        result = gr.Textbox(label="Result", interactive=False)
        users = gr.Dataframe(headers=["account", "role", "status"], label="Accounts", interactive=False)
        log = gr.Dataframe(headers=["when (UTC)", "account", "change", "by"], label="Changes to accounts, newest first", interactive=False)

    outputs = [result, password, users, log]
    tab.select(accounts, outputs=[users, log], api_name="accounts", api_visibility="undocumented")
    add.click(add_account, inputs=[name, role, password], outputs=outputs, api_name="add_account", api_visibility="undocumented")
    set_password.click(set_account_password, inputs=[name, password], outputs=outputs, api_name="set_account_password", api_visibility="undocumented")
    enable.click(enable_account, inputs=[name], outputs=outputs, api_name="enable_account", api_visibility="undocumented")
    disable.click(disable_account, inputs=[name], outputs=outputs, api_name="disable_account", api_visibility="undocumented")
