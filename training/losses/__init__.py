"""Loss library: SCEHR's anchor losses and SCR, plus related contrastive losses and samplers.

Conventions: anchor losses take anchor_logits [B, C, 2] = (uᵀz, vᵀz) and float targets [B, C];
contrastive losses take embeddings z [B, D] and binary labels [B] or [B, C] (per column).
"""

from training.losses.asymmetric import ACL, AFCL
from training.losses.base import AnchorLoss, ColumnPairLoss
from training.losses.classification import BCE, CBCE, CSCE
from training.losses.combined import CCE_LOSSES, POSITIVE_ANCHOR_ONLY, CombinedLoss, build_loss
from training.losses.debias import DebiasedSupCon, MemoryQueue
from training.losses.focal import FocalLoss
from training.losses.margin import MarginContrastiveLoss
from training.losses.ntxent import NTXent
from training.losses.positives import (
    AttributeKNNPositives,
    FeatureKNNPositives,
    KRandomPositives,
    PositiveSelector,
    SupConWithPositives,
)
from training.losses.regularizers import REGULARIZERS, Regularizer, build_regularizer
from training.losses.scr import SCR
from training.losses.triplet import TripletLoss

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
]
