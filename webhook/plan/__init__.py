"""``gpushare plan``: what a team's workload mix needs under each GPU-sharing scheme.

    workload        what a team runs: a pod (or pod template) and how many at once
    manifest_input, cluster_input, csv_input    the three ways workloads come in
    schemes         the schemes compared, and each workload's fate: the core's decision
    capacity        what an admitted pod takes of a GPU or node, per sharing mode
    isolation       what each mode isolates (memory, compute, faults)
    packing         first-fit decreasing and its lower bound
    outcome         one scheme's pools packed, and its totals
    report, pictures, html_report   the table and JSON, the pictures, the HTML page
    command         the CLI subcommand

Uses the core only through its public face (``webhook.core``), so the plan decides exactly
as the webhook does.
"""

from webhook.plan.command import add_plan_command, plan

__all__ = ["add_plan_command", "plan"]
