"""One typed decode recipe: ``DecodeSpec`` (target, proposer, sampling, limits; validated, from flags, JSON or YAML)
and ``build(spec)``, which opens the target and the proposer it describes, ready for ``accel.spd.generate``.

This package sits above the engine (``accel.spd``, ``accel.drafts``, ``accel.backends``): it may import them, they
never import it. See docs/spd.md, "DecodeSpec".
"""

from accel.decode.build import DecodeSetup, build
from accel.decode.spec import (
    ARSpec,
    ChainSpec,
    DecodeSpec,
    Eagle3ChainSpec,
    Eagle3TreeSpec,
    EarlyExitSpec,
    FirstOfSpec,
    HydraTreeSpec,
    LookupSpec,
    MergeSpec,
    ProposerSpec,
    SamplingSpec,
    SuperposedSpec,
    TargetSpec,
    TreeSpec,
    load_spec,
)

__all__ = [
    "ARSpec",
    "ChainSpec",
    "DecodeSetup",
    "DecodeSpec",
    "Eagle3ChainSpec",
    "Eagle3TreeSpec",
    "EarlyExitSpec",
    "FirstOfSpec",
    "HydraTreeSpec",
    "LookupSpec",
    "MergeSpec",
    "ProposerSpec",
    "SamplingSpec",
    "SuperposedSpec",
    "TargetSpec",
    "TreeSpec",
    "build",
    "load_spec",
]
