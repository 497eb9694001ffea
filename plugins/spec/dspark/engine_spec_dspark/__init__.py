"""dspark (speculative): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="dspark",
    family="speculative",
    implementation=None,
    description="DSPARK speculative decoding: a semi-autoregressive draft with confidence-scheduled ragged verify",
    requires=Requires(devices=("cpu", "cuda")),
    not_implemented=(
        "needs a DSpark draft checkpoint (parallel backbone + sequential head + confidence head) and a profiled steps-per-second table for ragged verify; neither the draft architecture nor per-request verify lengths from confidence are built here (the core verifies whatever chain a proposer drafts)"
    ),
)
