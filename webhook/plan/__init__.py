"""``gpushare plan``: what a team's workload mix needs under each GPU-sharing scheme.

Uses the core only through its public face (``webhook.core``), so the plan decides exactly
as the webhook does. This is the package's face: other packages import only the names below.
Layout: docs/architecture.md.
"""

from webhook.plan.cluster_input import read_cluster
from webhook.plan.csv_input import read_table
from webhook.plan.enforcement import enforcement_json, enforcement_lines
from webhook.plan.html_report import page
from webhook.plan.manifest_input import read_manifest_input, read_workloads
from webhook.plan.outcome import DEFAULT_GPUS_PER_NODE, SchemeOutcome, plan
from webhook.plan.pictures import write_pictures
from webhook.plan.report import as_json, details, table
from webhook.plan.workload import PlanInput, Workload

__all__ = [
    "DEFAULT_GPUS_PER_NODE",
    "PlanInput",
    "SchemeOutcome",
    "Workload",
    "as_json",
    "details",
    "enforcement_json",
    "enforcement_lines",
    "page",
    "plan",
    "read_cluster",
    "read_manifest_input",
    "read_table",
    "read_workloads",
    "table",
    "write_pictures",
]
