"""The drafters' public names, for code that embeds edgespec: each source lives in its own
module of :mod:`edgespec.runtime.sources`, and the registry there is the one list of them."""

from __future__ import annotations

from .sources import NAMES as DRAFTER_NAMES
from .sources import REGISTRY
from .sources import Draft, Drafter, DraftModel, Outcome, make_drafter
from .sources import check_name as check_drafter_name
from .sources.auto import AutoDrafter
from .sources.hybrid import HybridDrafter
from .sources.lookup import RESUME_SKIP, RESUME_WITHIN, LookupDrafter
from .sources.model import SINGLE_CATCHUP, ModelDrafter
from .sources.none import NoDrafter

#: the sources that use a draft model when one is loaded
MODEL_DRAFTERS = tuple(name for name, s in REGISTRY.items() if s.uses_draft_model)

__all__ = [
    "MODEL_DRAFTERS",
    "DRAFTER_NAMES", "Draft", "Drafter", "DraftModel", "Outcome", "make_drafter",
    "check_drafter_name", "AutoDrafter", "HybridDrafter", "RESUME_SKIP", "RESUME_WITHIN",
    "LookupDrafter", "SINGLE_CATCHUP", "ModelDrafter", "NoDrafter",
]
