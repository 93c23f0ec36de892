"""Loss library: SCEHR's anchor losses and SCR, plus related contrastive losses and samplers.

Conventions: anchor losses take anchor_logits [B, C, 2] = (uᵀz, vᵀz) and float targets [B, C];
contrastive losses take embeddings z [B, D] and binary labels [B] or [B, C] (per column).
"""

from scehr.training.losses.asymmetric import ACL, AFCL
from scehr.training.losses.base import AnchorLoss, ColumnPairLoss
from scehr.training.losses.classification import BCE, CBCE, CSCE
from scehr.training.losses.combined import (
    CCE_LOSSES,
    POSITIVE_ANCHOR_ONLY,
    CombinedLoss,
    build_loss,
    calibration_input,
)
from scehr.training.losses.debias import DebiasedSupCon, MemoryQueue
from scehr.training.losses.focal import FocalLoss
from scehr.training.losses.margin import MarginContrastiveLoss
from scehr.training.losses.ntxent import NTXent
from scehr.training.losses.positives import (
    AttributeKNNPositives,
    FeatureKNNPositives,
    KRandomPositives,
    PositiveSelector,
    SupConWithPositives,
)
from scehr.training.losses.regularizers import REGULARIZERS, Regularizer, build_regularizer
from scehr.training.losses.scr import SCR
from scehr.training.losses.triplet import TripletLoss

__all__ = [
    "ACL",
    "AFCL",
    "BCE",
    "CBCE",
    "CCE_LOSSES",
    "CSCE",
    "POSITIVE_ANCHOR_ONLY",
    "REGULARIZERS",
    "SCR",
    "AnchorLoss",
    "AttributeKNNPositives",
    "ColumnPairLoss",
    "CombinedLoss",
    "DebiasedSupCon",
    "FeatureKNNPositives",
    "FocalLoss",
    "KRandomPositives",
    "MarginContrastiveLoss",
    "MemoryQueue",
    "NTXent",
    "PositiveSelector",
    "Regularizer",
    "SupConWithPositives",
    "TripletLoss",
    "build_loss",
    "build_regularizer",
    "calibration_input",
]
