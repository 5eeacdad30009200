"""What kind of source a profile constant's provenance names: measured, fitted, cited, assumed
or derived (what ``coda profile show`` prints beside each constant).

- **measured**: read from a measurement this project's tools took or were given (the shared
  operator files, an engine measured through its API), unchanged;
- **fitted**: a least-squares or search fit to measurements, or calibrated to published results;
- **cited**: stated by a source outside the project (a datasheet, a model card, a paper, vLLM's
  or NCCL's source, a third party's published measurement), or given by the user;
- **assumed**: chosen without a measurement of this setup (copied from another profile or GPU,
  borrowed bounds, a term set to 0 because nothing measured it);
- **derived**: computed from other constants by the rule its provenance states (a roofline
  ratio, 90% of memory minus the weights).

The class is read from the provenance text's leading ``word:`` (each shipped profile's constants
start with one; ``tests/unit/test_cost_provenance.py`` keeps it so); a text without a known
prefix is ``unstated``.
"""

from __future__ import annotations

CLASSES = ("measured", "fitted", "cited", "assumed", "derived")

#: leading words of a provenance text, longest first where one is a prefix of another
_PREFIXES: tuple[tuple[str, str], ...] = (
    ("measured by others", "cited"),
    ("measured", "measured"),
    ("fitted", "fitted"),
    ("fit", "fitted"),
    ("calibrated", "fitted"),
    ("datasheet", "cited"),
    ("model card", "cited"),
    ("model structure", "cited"),
    ("paper setup", "cited"),
    ("paper", "cited"),
    ("vllm source", "cited"),
    ("vendor", "cited"),
    ("nccl's tuning model", "cited"),
    ("flashattention-2", "cited"),
    ("given", "cited"),
    ("derived from the model config", "cited"),
    ("derived from config.json", "cited"),
    ("derived", "derived"),
    ("assumed", "assumed"),
    ("not measured", "assumed"),
    ("borrowed", "assumed"),
    ("scaled", "assumed"),
    ("transferred", "assumed"),
)


def classify(provenance: str) -> str:
    """The source class of one provenance text (see the module docstring)."""
    text = provenance.strip().lower()
    for prefix, cls in _PREFIXES:
        if text.startswith(prefix):
            return cls
    if "calibrated to" in text:  # the calibrated A100 profile's named terms, which name their term first
        return "fitted"
    return "unstated"
