"""Turn what the user typed (a torchvision name, a demo, a file, a factory) into a LoadedModel.

Nothing here runs code from a file or a factory unless the caller passes ``trust=True``:
checkpoints are read with ``weights_only=True`` first, and only a file that cannot be read
that way (a pickled ``nn.Module``, a ``torch.export`` archive) or a Python factory asks for
trust.

The package is split by what the user points at:

- ``torchvision_models``: torchvision names and weights, building, preprocessing;
- ``state_dicts``: finding a state dict in a checkpoint and fitting it to a model;
- ``pickles``: pickled modules and ``torch.export`` archives (trusted only);
- ``factories``: ``module:function`` and ``file.py:function``;
- ``hf_models``, ``hf_files``, ``hf_size``: Hugging Face models, what their folders hold
  (read before transformers reads them) and their size from their config;
- ``timm_models``, ``hub``: timm models, and the hub both download from;
- ``files``: telling a file's kind from its name and contents;
- ``loading``: ``load_model``, which picks among them, ``check_capturable`` and
  ``trust_subject``.
"""

from typing import TYPE_CHECKING

from gradexplorer.base.lazy import attach

__all__ = ["load_model", "check_capturable", "trust_subject", "LoadedModel", "ModelLoadError", "TrustRequired"]

# Imported on first use: ``loading`` imports torchvision, which a module that only needs
# ``LoadedModel`` should not pay for.
__getattr__, __dir__ = attach(__name__, {
    "load_model": "gradexplorer.models.loading",
    "check_capturable": "gradexplorer.models.loading",
    "trust_subject": "gradexplorer.models.loading",
    "LoadedModel": "gradexplorer.models.loaded_model",
    "ModelLoadError": "gradexplorer.base.errors",
    "TrustRequired": "gradexplorer.base.errors",
})

if TYPE_CHECKING:
    from gradexplorer.base.errors import ModelLoadError, TrustRequired
    from gradexplorer.models.loaded_model import LoadedModel
    from gradexplorer.models.loading import check_capturable, load_model, trust_subject
