"""dspark (speculative): manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="dspark",
    family="speculative",
    implementation=None,
    description="DSPARK speculative decoding: a semi-autoregressive draft with confidence-scheduled ragged verify",
    requires=Requires(devices=("cpu", "cuda")),
    not_implemented=(
        "needs the DSpark draft architecture (a DFlash-style parallel backbone plus a light sequential head drafting a semi-autoregressive block) and its checkpoint layout, which are not built here; its compact ragged verify also needs a trained confidence head and a profiled steps-per-second table (the static mode would verify its block as a chain, as DFLASH does)"
    ),
)
