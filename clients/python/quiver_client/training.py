"""Push the adapter at the end of training: a ``transformers`` ``TrainerCallback``.

>>> from quiver_client.training import QuiverPushCallback
>>> trainer = Trainer(model=peft_model, args=args, train_dataset=ds,
...                   callbacks=[QuiverPushCallback("support-bot", base_model="tiny-llama")])
>>> trainer.train()  # then: saved to <output_dir>/quiver-push, validated locally, uploaded, validated

Needs ``transformers`` (``pip install quiver-client[training]``); the model must be a PEFT model (its
``save_pretrained`` writes ``adapter_config.json`` and ``adapter_model.safetensors``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from quiver_client.api import Client
from quiver_client.errors import QuiverError
from quiver_client.names import check_adapter_name
from quiver_client.progress import Reporter, Silent
from quiver_client.upload import PushResult, push


class QuiverPushCallback(TrainerCallback):  # type: ignore[misc]
    """Saves the PEFT adapter when training ends and pushes it to Quiver (main process only).

    Args:
        name: The adapter's name (what applications send as ``model``).
        base_model: The registered base model (needed to create the adapter).
        url: Server URL (default: ``QUIVER_URL`` or the config file).
        api_key: Tenant key (default: ``QUIVER_API_KEY`` or the config file).
        wait: Wait until the version is validated (``ready``), raising if it is rejected.
        reporter: Progress output (default: none).
        **push_options: More :func:`quiver_client.upload.push` options (``parallel``, ``timeout``...).

    Attributes:
        result: The :class:`~quiver_client.upload.PushResult` once pushed.

    Raises:
        QuiverError: ``invalid_name`` at once, before training, when ``name`` breaks the server's naming rule.

    Raises (from ``on_train_end``):
        QuiverError: the push failed (``ValidationFailed`` for a rejected adapter), naming the fix.
    """

    def __init__(self, name: str, *, base_model: str | None = None, url: str | None = None,
                 api_key: str | None = None, wait: bool = True, reporter: Reporter | None = None,
                 **push_options: Any) -> None:
        # Checked now, not after training: a name the server refuses would waste the whole run.
        self.name, self.base_model, self.url, self.api_key = check_adapter_name(name), base_model, url, api_key
        self.wait, self.reporter, self.push_options = wait, reporter or Silent(), push_options
        self.result: PushResult | None = None

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Save ``model`` to ``<output_dir>/quiver-push`` (safetensors) and push it."""
        if not state.is_world_process_zero:
            return
        if model is None or not hasattr(model, "peft_config"):
            raise QuiverError("QuiverPushCallback needs a PEFT model (peft.get_peft_model(...)); the Trainer's model "
                              "is not one.", code="not_peft")
        folder = Path(args.output_dir) / "quiver-push"
        model.save_pretrained(folder, safe_serialization=True)
        with Client(self.url, self.api_key) as client:
            self.result = push(client, folder, name=self.name, base_model=self.base_model,
                               wait_validation=self.wait, reporter=self.reporter, **self.push_options)
