"""The kernel problems of a Sequential model: listing them, tuning them on a GPU, and the report
of which implementation runs each one.
"""
from __future__ import annotations

from typing import Any, Iterator

from autocnn.kernels.problem import precision_label
from autocnn.nn.backend import KernelProblem
from autocnn.nn.layers import Dense
from autocnn.nn.text_table import format_table
from autocnn.nn.validation import check_batch_size


class ModelKernels:
    """Sequential's kernel problems (mixed into ``autocnn.nn.model.Sequential``)."""

    @staticmethod
    def _collect_problems(per_layer: Iterator[list[KernelProblem]]) -> list[KernelProblem]:
        seen: dict[KernelProblem, None] = {}
        for problems in per_layer:
            for p in problems:
                seen.setdefault(p, None)
        return list(seen)

    def problems(self, batch_size: int | None = None, alternatives: bool = False) -> list[KernelProblem]:
        """Every kernel problem of a training step at ``batch_size`` (default: the built one), deduplicated;
        each convolution's at its layer's precision (``Conv2d.precision``). With ``alternatives``, also
        the problems of other ways to run a layer (``Layer.alternative_problems``: a convolution's
        one-pass backward; nn.layer_fusion: a convolution fused with the averaging after it), which
        tuning covers so that a build can choose them."""
        if batch_size is None:
            batch_size = self._require_built()
            if not alternatives:
                return self._collect_problems(layer.problems() for layer in self.layers)
        batch_size = check_batch_size(batch_size)
        inputs = [self.input_shape, *self.layer_output_shapes[:-1]]
        per_layer = [layer.make_problems(shape, batch_size) for layer, shape in zip(self.layers, inputs)]
        if alternatives:
            from autocnn.nn.layer_fusion import conv_pool_pairs

            for i, (layer, shape) in enumerate(zip(self.layers, inputs)):
                per_layer[i] = per_layer[i] + layer.alternative_problems(shape, batch_size)
            for pair in conv_pool_pairs(self.layers, inputs, batch_size):
                per_layer[pair.index] = per_layer[pair.index] + pair.problems()
        return self._collect_problems(iter(per_layer))

    def tune(self, batch_size: int, trials: int = 200, timeout_s: float | None = None, device: int = 0,
             storage: str | None = None, sampler: str = "tpe", progress: bool = True) -> list[Any]:
        """Tune every kernel this model runs at ``batch_size`` on a GPU and keep the winners.

        ``trials`` is the budget for the whole model, spent where the model spends its time. Each
        convolution is tuned at its layer's precision (set the model's first: ``model.precision``). The
        winners go to the tuning database; a model built on the cuda backend picks them up at once.
        Returns one ``autocnn.search.tuner.TuneOutcome`` per kernel problem.
        """
        from autocnn.store.database import TuningDatabase
        from autocnn.measurement.sources import GpuSource
        from autocnn.search.network import tune_problems
        from autocnn.search.tuner import TuneSettings, Tuner

        problems = self.problems(batch_size, alternatives=True)
        source = GpuSource(device)
        try:
            tuner = Tuner(source, TuningDatabase(), TuneSettings(trials=max(1, trials), sampler=sampler,
                                                                 storage=storage), progress=progress)
            outcomes = tune_problems(tuner, problems, trials, timeout_s=timeout_s)
        finally:
            source.close()
        if self.backend.name == "cuda" and self.batch_size is not None:
            # Forget the kernels chosen before tuning, then build again so the winners are used.
            reset = getattr(self.backend, "forget", None)
            if reset is not None:
                reset(problems)
            self._rebuild()
        return outcomes

    def dispatch_report(self) -> str:
        """Which implementation runs each kernel of each layer, as a table (Dense layers too), with
        each kernel's precision: the layer's for convolutions, "-" for pooling (float32, whatever the model's),
        fp32 for Dense (cuBLAS SGEMM)."""
        self._require_built()
        by_problem = {d.problem: d for d in self.dispatch}
        rows = [("layer", "op", "precision", "shape", "kernel", "detail")]
        for i, layer in enumerate(self.layers):
            for p in layer.problems():
                d = by_problem[p]
                rows.append((str(layer.name), p.op, precision_label(p), p.shape_string(), d.source,
                             d.detail))
            if isinstance(layer, Dense):
                head = i == len(self.layers) - 1 and layer.can_end_with_loss
                source, detail = self.backend.dense_dispatch(layer.in_features, layer.out_features, head,
                                                             layer.element)
                shape = f"N={self.batch_size},in={layer.in_features},out={layer.out_features}"
                precision = layer.precision.name if layer.element.size == 2 else "fp32"
                rows.append((str(layer.name), "dense+loss" if head else "dense", precision, shape, source, detail))
        title = (f"kernels on the {self.backend.name} backend at batch size {self.batch_size}, "
                 f"model precision {self.precision}")
        if not self.dispatch:
            title += " (no convolution or pooling layers)"
        if len(rows) == 1:
            return title
        return title + ":\n" + format_table(rows)
