"""Any model through its reference implementation (mlx-lm, mlx-vlm), traced module by
module.  See :mod:`workbench.reference.model` and :mod:`workbench.reference.recorder`."""
from workbench.reference.model import ReferenceModel, Session, open_reference

__all__ = ["ReferenceModel", "Session", "open_reference"]
