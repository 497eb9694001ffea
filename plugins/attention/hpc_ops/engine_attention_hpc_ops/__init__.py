"""hpc_ops attention: manifest only; this build has no implementation."""

from engine.api import Plugin, Requires

plugin = Plugin(
    name="hpc_ops",
    family="attention",
    implementation=None,
    description="HPC-Ops attention kernels",
    requires=Requires(packages=("hpc-ops",),
                      devices=("cuda",),
                      min_compute_capability=(9, 0),
                      max_compute_capability=(9, 0)),
    not_implemented=(
        "needs the HPC-Ops kernel library (hpc-ops) on a Hopper GPU (SM90), page size 64; no "
        "adapter in this build"
    ),
)
