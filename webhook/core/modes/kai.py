"""KAI-Scheduler hand-over: KAI reads the same annotation words as gpushare (``gpu-fraction``,
``gpu-memory`` in MiB, ``gpu-fraction-container-name``, ``gpu-fraction-num-devices``:
NVIDIA/KAI-Scheduler pkg/common/constants/constants.go) and shares GPUs itself, through
reservation pods and its binder, for pods with ``schedulerName: kai-scheduler`` and a queue
label ``kai.scheduler/queue`` (the same file: DefaultSchedulerName, DefaultQueueLabel).

So this mode adds no resources: it keeps the annotations, checks them as KAI's binder will
(pkg/binder/plugins/gpusharing/gpu-request/gpu_request_validator.go: a fraction strictly
between 0 and 1, gpu-memory a whole number of MiB, not both at once, num-devices a whole
number above 0) so a pod KAI would refuse is refused at admission with the reason, and
hands the pod to kai-scheduler with the policy's queue. KAI enforces no memory limit
(docs/schemes.md), so gpushare adds the framework env where the share of a GPU is known.

Pods a user already sent to kai-scheduler are left to it under any other mode
(``planning``), so gpushare and KAI never both act on one pod.
"""

from __future__ import annotations

from webhook.constants import FRACTION_ANNOTATION, MEMORY_ANNOTATION
from webhook.core.modes.base import ModeChanges, ModeProfile, frozen_record
from webhook.core.modes.scheme_share import SchemeMode, read_share, scheme_placement, settings
from webhook.core.placement import Placement, format_fraction
from webhook.core.policy.model import Mode, Policy, frozen_map
from webhook.core.policy.schemes import KAI_QUEUE_LABEL
from webhook.core.quantity import is_bare_number
from webhook.core.request import GpuRequest


class KaiHandOver(SchemeMode):
    mode = Mode.KAI
    several_devices = True

    def place(self, policy: Policy, request: GpuRequest) -> Placement | list[str]:
        scheduler = settings(policy).kai.scheduler_name
        if request.fraction is not None and request.memory_text is not None:
            return [
                f"{scheduler} refuses {FRACTION_ANNOTATION} and {MEMORY_ANNOTATION} on one pod "
                "(KAI-Scheduler gpu_request_validator.go): keep only one of the two."
            ]
        text = request.memory_text
        if text is not None and not is_bare_number(text):
            mib = request.memory_mib or 0
            whole = int(mib) if mib == int(mib) else int(mib) + 1
            return [
                f'{scheduler} reads {MEMORY_ANNOTATION} as a whole number of MiB, not "{text}": '
                f'write "{whole}".'
            ]
        share = read_share(policy, request)
        if isinstance(share, list):
            return share
        what = (
            f"{format_fraction(share.fraction)} of a GPU"
            if request.fraction is not None or share.fraction is not None
            else f"{request.memory_text}Mi"
        )
        note = f"handed to {scheduler}: {what} on each of {request.devices} GPU(s)"
        return scheme_placement(policy, share, 0, 1, note, request.devices)

    def changes(self, policy: Policy, placement: Placement) -> ModeChanges:
        kai = settings(policy).kai
        labels = frozen_map({KAI_QUEUE_LABEL: kai.queue} if kai.queue else {})
        return ModeChanges(
            scheduler_name=kai.scheduler_name,
            labels=labels,
            record=frozen_record({"scheduler": kai.scheduler_name, "devices": placement.devices}),
            frameworks=placement.share_known,
        )

    def whole_gpu_changes(self, policy: Policy, count: int) -> ModeChanges | str:
        scheduler = settings(policy).kai.scheduler_name
        return (
            f'{FRACTION_ANNOTATION} "{count}" asks for whole GPUs, which {scheduler} takes as '
            f"resources, not as {FRACTION_ANNOTATION} (it reads only shares below 1): remove the "
            f"annotation and ask for nvidia.com/gpu: {count} in the container's resources."
        )

    def profile(self, policy: Policy) -> ModeProfile:
        kai = settings(policy).kai
        return ModeProfile(
            isolation="none: KAI-Scheduler enforces no memory or compute limit (its GPU "
            "sharing only places pods); gpushare adds framework env",
            node_requirements=f"KAI-Scheduler ({kai.scheduler_name}, binder, reservation pods "
            "on the NVIDIA device plugin's nvidia.com/gpu)"
            + (f", queue {kai.queue}" if kai.queue else ", a queue label on every pod"),
            scheduler=kai.scheduler_name,
        )
