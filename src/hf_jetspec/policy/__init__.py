"""The round policy: cost model, acceptance estimates, verify-length selection and free n-gram drafts."""

from .acceptance import ACCEPTANCE_CALIBRATION_NAME, AcceptanceModel, AcceptanceRecord, acceptance_features, fit_acceptance, node_features
from .cost_model import CostModel, batch_cost_profile_for, cost_profile_for, interpolate_monotone, profile_forward_cost
from .ngram import NgramIndex, NgramProposal, OutputMemory, periodic_continuation, propose_ngram
from .round_policy import Candidate, DraftGate, RoundChoice, best_candidate
from .score_calibration import ScoreCalibration, chain_conditionals, position_bucket, score_bin
from .verify_length import VerifyChoice, choose_batch_width, choose_tree_size, choose_verify_length, expected_committed, expected_committed_tree

__all__ = [
    "ACCEPTANCE_CALIBRATION_NAME",
    "AcceptanceModel",
    "AcceptanceRecord",
    "Candidate",
    "CostModel",
    "DraftGate",
    "NgramIndex",
    "NgramProposal",
    "OutputMemory",
    "RoundChoice",
    "ScoreCalibration",
    "chain_conditionals",
    "VerifyChoice",
    "acceptance_features",
    "best_candidate",
    "choose_tree_size",
    "choose_verify_length",
    "batch_cost_profile_for",
    "choose_batch_width",
    "cost_profile_for",
    "expected_committed",
    "expected_committed_tree",
    "fit_acceptance",
    "interpolate_monotone",
    "node_features",
    "periodic_continuation",
    "profile_forward_cost",
    "propose_ngram",
    "position_bucket",
    "score_bin",
]
