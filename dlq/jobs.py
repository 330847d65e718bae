"""RQ entry points of the console (registered with the engine's allow-list by ``DlqConfig.ready``)."""

from __future__ import annotations

from django.db import close_old_connections

from dlq.bulk import bulk_operation_deliver, bulk_operation_run_slice


def run_bulk_operation(operation_id: int) -> str:
    close_old_connections()
    status = bulk_operation_run_slice(operation_id=int(operation_id))
    if status == "continue":
        bulk_operation_deliver(operation_id=int(operation_id))
    return status
