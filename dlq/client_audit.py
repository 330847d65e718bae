"""The audit of API clients: one entry for every creation, revoke and signing-secret rotation, and every refusal.

A client's token lets a program in, and revoking it stops all of its traffic
and callbacks, whoever does it: the admin's list action (the actor is the
username), ``manage.py create_api_token``, ``revoke_api_token`` and
``callback_secret --rotate`` (``command:<OS user>``), Python code
(``system:python``). The engine (``tasks.lifecycle.clients``) sends ``api_client_changed``
inside the change's transaction and ``api_client_refused`` when it refuses
one; the receivers connected here (``DlqConfig.ready()``, every process)
write the entry. A denied attempt through the admin never reaches the engine:
``DenialsAuditedMixin`` audits it, under the same action and target type.
"""

from __future__ import annotations

from dlq.audit import audit_record
from dlq.audit_actions import CLIENT_CREATED, CLIENT_REVOKED, CLIENT_SECRET_ROTATED
from dlq.audit_details import refusal_detail
from dlq.control_audit import audit_actor
from dlq.models import AuditOutcome
from tasks.lifecycle import CREATED, REVOKED, SECRET_ROTATED, api_client_changed, api_client_refused

# The entries' target type: the model's name, as a denial of its admin pages records it.
CLIENT_TARGET = "apiclient"
# The engine's changes by the audit log's action codes.
CLIENT_ACTIONS = {CREATED: CLIENT_CREATED, REVOKED: CLIENT_REVOKED, SECRET_ROTATED: CLIENT_SECRET_ROTATED}


def client_change_audited(sender, *, client, action: str, actor: str, client_ip=None, **kwargs) -> None:
    """``api_client_changed``'s receiver: the change's entry, in its transaction."""
    audit_record(
        actor=audit_actor(actor),
        action=CLIENT_ACTIONS[action],
        target_type=CLIENT_TARGET,
        target_id=client.name,
        outcome=AuditOutcome.SUCCEEDED,
        client_ip=client_ip,
    )


def client_refusal_audited(sender, *, name: str, action: str, actor: str, error, client_ip=None, **kwargs) -> None:
    """``api_client_refused``'s receiver: the refusal's entry, its reason as the engine's code and facts."""
    audit_record(
        actor=audit_actor(actor),
        action=CLIENT_ACTIONS[action],
        target_type=CLIENT_TARGET,
        target_id=name,
        outcome=AuditOutcome.REFUSED,
        detail=refusal_detail(error),
        client_ip=client_ip,
    )


def receivers_connect() -> None:
    """Connect the receivers (idempotent)."""
    api_client_changed.connect(client_change_audited, dispatch_uid="dlq.client_audit.changed")
    api_client_refused.connect(client_refusal_audited, dispatch_uid="dlq.client_audit.refused")
