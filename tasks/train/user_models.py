"""The user's own Keras model (`train.model`): `package.module:function`,
`path/to/file.py:function`, or a saved `.keras` file.

The function is called with the data's spec (`tasks.data.spec.FeatureSpec`: the features'
names, shapes and dtypes, the label's kind and classes), or with nothing where it takes no
parameter, inside the strategy's scope of every process that trains. It returns a
`keras.Model`. Compiled, its loss and metrics are what the training minimises and the
held-out split reports, and its optimizer what updates it (`tasks.train.optimizers`);
not compiled, the label kind's defaults.

`check_user_model` builds it once before anything trains, and says in one line what does
not fit: the return, the inputs against the data's features, the outputs against the
label, the loss against the label's kind, the target metric.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from tfscale.tasks.core.errors import UsageError, UserError
from tfscale.tasks.core.label_kinds import KINDS, mismatch_fix
from tfscale.tasks.core.user_code import (
    called,
    is_function_ref,
    load_function,
    one_line,
    plain,
)
from tfscale.tasks.data.spec import FeatureSpec
from tfscale.tasks.train import callbacks
from tfscale.tasks.train.model_inputs import as_model_takes
from tfscale.tasks.train.objectives import Built, Objective, loss_name

KERAS_SUFFIX = ".keras"
BUILT_IN = ("mlp", "cnn", "resnet", "embedding")
FORMS = (
    "mlp, cnn, resnet, embedding, package.module:function, path/to/file.py:function, "
    "or a saved .keras file"
)


class ModelError(UsageError):
    """The user's model cannot be built, or does not fit the data: exit code 2."""


class ModelRaised(UserError):
    """The user's model function raised: exit code 1, their error in one line."""


def is_user_model(ref: str) -> bool:
    return ref not in BUILT_IN


def check_ref(ref: str) -> None:
    """A built-in name, a function reference (its `.py` file there) or a `.keras` path;
    else a `ModelError`. Imports nothing: a sweep checks it before anything starts."""
    if ref in BUILT_IN:
        return
    if is_function_ref(ref):
        module = ref.rsplit(":", 1)[0]
        if module.endswith(".py") and not Path(module).is_file():
            raise ModelError(
                f"--model {ref}: {module}: no such file",
                "give the path of the Python file, relative to where tfscale runs",
            )
        return
    if ref.endswith(KERAS_SUFFIX):
        if not Path(ref).is_file():
            raise ModelError(
                f"--model {ref}: no such file", "give the path of a saved .keras model"
            )
        return
    raise ModelError(f"Unknown model {ref!r}", f"expected {FORMS}")


def user_model(ref: str, spec: FeatureSpec) -> Built:
    """The user's model for the data's spec, with its objective: from its compile (or the
    label kind's defaults).

    Raises:
        ModelError: it cannot be loaded or built, or is not a Keras model.
        ModelRaised: the user's function raised.
    """
    import keras

    check_ref(ref)
    model = _load_saved(ref) if ref.endswith(KERAS_SUFFIX) else _made(ref, spec)
    if (given := callbacks.split(model)) is not None:  # (model, callbacks), as fit takes them
        model = given[0]
        callbacks.keep(model, given[1])
    if not isinstance(model, keras.Model):
        raise ModelError(
            f"--model {ref} returned {type(model).__name__}, not a keras.Model",
            "return the model (keras.Sequential, keras.Model(inputs, outputs) or a subclass), "
            "or the model and a list of Keras callbacks: return model, [callback, ...]",
        )
    _refuse_own_optimizers(ref, model)  # the documented refusal first, before any build
    if not model.built or not model.weights:  # a subclassed model: its variables, now
        try:
            model(example_batch(spec), training=False)
        except Exception as exc:  # noqa: BLE001 - the user's model: whatever it raises
            raise ModelError(
                f"--model {ref} does not build on this data's features: {_failure_line(exc)}",
                "give the model a call() that takes the features (a dict by name, or one "
                "tensor), and build it in the function",
            ) from exc
    return Built(model, objective_from(model, spec, ref))


def _made(ref: str, spec: FeatureSpec) -> Any:
    """What the user's model function returns, given the spec where it takes one.

    Raises:
        ModelRaised: the function raised, or exited.
    """
    function, _ = load_function(ref, "model", ModelError)
    takes = [
        p
        for p in inspect.signature(function).parameters.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    return called(function, (spec,) if takes else (), f"--model {ref}", "model", ModelRaised)


OWN_OPTIMIZERS_FIX = (
    "tfscale sets the rate and measures through the optimizer compile() gives the model: "
    "apply the gradients with self.optimizer; a model trained by several optimizers of its "
    "own (a GAN) is trained outside tfscale, whose loops (--loop tfscale and fit) both "
    "measure through model.optimizer"
)


def _other_optimizers(model: Any) -> list[str]:
    """The names of the optimizers a model holds besides `model.optimizer`."""
    import keras

    optimizer = getattr(model, "optimizer", None)
    return [
        name for name, value in vars(model).items()
        if isinstance(value, keras.optimizers.Optimizer) and value is not optimizer
    ]  # fmt: skip


def _refuse_own_optimizers(ref: str, model: Any) -> None:
    """A model with its own `train_step` holding optimizers other than `model.optimizer`
    (Keras's GAN example: `compile(d_optimizer, g_optimizer, loss_fn)`) updates through
    them: refused as it is returned, whatever else it lacks."""
    from tfscale.tasks.train.keras_meaning import own_train_step

    others = _other_optimizers(model)
    if others and own_train_step(model):
        raise ModelError(
            f"--model {ref}: its train_step does not update through model.optimizer but "
            f"through {', '.join(others)}",
            OWN_OPTIMIZERS_FIX,
        )


def example_batch(spec: FeatureSpec) -> Any:
    """One example of zeros (empty text) of each feature: a tensor, or a dict by name; the
    packed features' vector (`FeatureSpec.packed`)."""
    import numpy as np

    if spec.packed:
        return np.zeros((1, len(spec.packed)), "float32")

    def zero(feature: Any) -> Any:
        shape = (1, *feature.padded_shape)
        if feature.dtype == "string":  # a string tensor: Keras takes no numpy object array
            import tensorflow as tf

            return tf.fill(shape, "")
        dtype = {"uint8": "uint8", "int32": "int32", "int64": "int64", "bool": "bool"}
        return np.zeros(shape, dtype=dtype.get(feature.dtype, "float32"))

    values = {spec.key_of(f): zero(f) for f in spec.features}
    return next(iter(values.values())) if len(values) == 1 else values


def example_labels(spec: FeatureSpec) -> Any:
    """One example's label of zeros, as the data gives it (class ids are integers)."""
    import numpy as np

    label = spec.label
    return np.zeros((1, *label.shape), "int64" if label.kind == "class" else "float32")


def _load_saved(path: str) -> Any:
    import zipfile

    import keras

    if Path(path).is_file() and Path(path).stat().st_size == 0:
        raise ModelError(
            f"--model {path} is empty (0 bytes): not a saved model",
            "save the model again with model.save('model.keras'), or pass a function that "
            "builds the model (--model file.py:function)",
        )
    try:
        return keras.models.load_model(path)
    except (ValueError, TypeError, OSError, zipfile.BadZipFile) as exc:
        text = one_line(exc)
        custom = "custom" in text.lower() or "Could not locate" in text
        raise ModelError(
            f"--model {path} did not load: {text}",
            "a .keras file holds its custom layers' and functions' names, not their code "
            "(registered or not, the module defining them must be imported first): pass "
            "the function that builds the model (--model file.py:function), whose module "
            "defines them, each layer with a get_config"
            if custom
            else "save it again with model.save('model.keras'), or pass a function that "
            "builds the model (--model file.py:function)",
        ) from None


def objective_from(model: Any, spec: FeatureSpec, ref: str = "") -> Objective:
    """What the model is trained for: its compiled loss and metrics, or the label kind's
    defaults for its outputs (logits, or probabilities after a softmax or sigmoid). `ref`:
    where the model came from (`--model`'s value), for an error to name it."""
    import keras

    from_logits = not _ends_in_probabilities(model)
    if not getattr(model, "compiled", False) or getattr(model, "loss", None) is None:
        return Objective(spec.label, from_logits)
    loss = model.loss
    if isinstance(loss, (list, tuple, dict)) and len(loss) == 1 and len(model.outputs or ()) == 1:
        loss = next(iter(loss.values() if isinstance(loss, dict) else loss))  # Keras's own
    if isinstance(loss, (list, tuple, dict)):
        raise ModelError(
            f"--model {ref or model.name} is compiled with {len(loss)} losses; tfscale's "
            "data has one label, so every output but one would train on nothing",
            "give the model one output, compiled with one loss",
        )
    named = isinstance(loss, str)
    loss = keras.losses.get(loss) if named else loss
    kwargs = getattr(loss, "_fn_kwargs", None)
    if isinstance(kwargs, dict) and "from_logits" in kwargs:
        from_logits = bool(kwargs["from_logits"])
    elif named:
        from_logits = False  # Keras's losses by name take probabilities
    config = model.get_compile_config()
    metrics, weighted = (_flat(config.get(key)) for key in ("metrics", "weighted_metrics"))
    return Objective(spec.label, from_logits, loss, metrics, weighted_metrics=weighted)


def _flat(metrics: Any) -> tuple[Any, ...]:
    """A compile's metrics (serialized) as one tuple: a list's, a dict's values', one."""
    if isinstance(metrics, dict):
        return tuple(m for value in metrics.values() for m in _flat(value))
    if isinstance(metrics, (list, tuple)):
        return tuple(metrics)
    return () if metrics is None else (metrics,)


def _ends_in_probabilities(model: Any) -> bool:
    """Whether the model's last layer is a softmax or a sigmoid: a `Dense(activation=)`,
    an `Activation` or a `Softmax` layer."""
    import keras

    last = model.layers[-1] if model.layers else None
    if isinstance(last, keras.layers.Softmax):
        return True
    activation = getattr(last, "activation", None)
    return getattr(activation, "__name__", "") in ("softmax", "sigmoid")


def parameter_count(model: Any) -> int:
    import math

    return int(sum(math.prod(w.shape) for w in model.weights))


def check_user_model(
    ref: str, manifest: Any, data_dir: str, evaluate: Any, run: Any = None
) -> None:
    """Builds the user's model once, before anything trains or is written, and runs a few
    training examples through it, its loss and the target metric (`evaluate`, an
    `EvaluateConfig`): the worker processes and cluster tasks that build it again then
    build what was checked here.

    Raises:
        ModelError: the model does not load or build; its inputs do not take the data's
            features, its outputs do not fit the label, its loss does not fit the label's
            kind; the target metric is not one it reports; a custom layer has no
            `get_config` (the trained model is saved and read back).
        ModelRaised: the user's function raised; its own `train_step` raised.
        ModelError: its own `train_step` updates with optimizers other than the one it was
            compiled with; what a pipeline cut or gradient accumulation (`run`: its
            `TrainConfig` and `StrategyChoice`) cannot train as the model means it.
    """
    from tfscale.tasks.data.inputs import build_dataset

    spec = manifest.spec
    model, objective = user_model(ref, spec)
    manifest = as_model_takes(manifest, model)
    _say_packed(ref, manifest.spec)
    rows = max(1, min(32, manifest.splits["train"]))
    features, labels = next(iter(build_dataset(manifest, data_dir, "train", rows, training=False)))
    outputs = _check_inputs(ref, model, spec, features)
    _check_test_step(ref, model)
    _check_kind(ref, objective, spec.label.kind)
    _check_loss(ref, objective, labels, outputs)
    _check_target(objective, evaluate)
    _check_rebuilds(ref, model)
    if run is not None:
        _check_how_trained(ref, model, *run)
        _check_fit_takes(ref, spec, *run)
        _check_callbacks(ref, model, manifest, run[0])
    _check_own_step(ref, Built(model, objective), features, labels)


_SAID: set[tuple[str, tuple[str, ...]]] = set()


def _say_packed(ref: str, spec: FeatureSpec) -> None:
    """The line that says how a model of one input takes the data's features, once."""
    if not spec.packed or (ref, spec.packed) in _SAID:
        return
    _SAID.add((ref, spec.packed))
    from tfscale.tasks.core.progress import status

    left = [f.name for f in spec.features if f.name not in spec.packed]
    status(
        "model",
        f"{ref} takes the {len(spec.packed)} numeric features as one vector, in the data's "
        "order" + (f"; left out: {', '.join(left)} (not one number each)" if left else ""),
    )


def _check_inputs(ref: str, model: Any, spec: FeatureSpec, features: Any) -> Any:
    """The model's outputs on a batch of the data's features, one per label value."""
    try:
        outputs = model(features, training=False)
    except Exception as exc:  # noqa: BLE001 - the user's model: whatever it raises
        raise ModelError(
            f"--model {ref} does not take this data's features: {type(exc).__name__}: "
            f"{one_line(exc)}; the model's inputs are {inputs_of(model)}, the data's "
            f"features {features_of(spec)}",
            "give the model one input per feature, named as spec.features' keras_name and "
            "shaped as the feature"
            + (
                f", or one input of shape ({len(spec.numbers)},) over the numeric features "
                "in the data's order"
                if len(spec.numbers) > 1
                else ""
            )
            + " (the function receives the spec)",
        ) from exc
    if isinstance(outputs, (list, tuple, dict)) and len(outputs) > 1:
        raise ModelError(
            f"--model {ref} gives {len(outputs)} outputs; tfscale's data has one label "
            f"({spec.label.kind}), so every output but one would train on nothing",
            "give the model one output (several labels: one model each, or one output of "
            "their values together)",
        )
    if isinstance(outputs, (list, tuple, dict)):
        outputs = next(iter(outputs.values() if isinstance(outputs, dict) else outputs))
    width = output_width(outputs)
    if width != spec.label.outputs:
        raise ModelError(
            f"--model {ref} gives {width} output(s) per example; the label "
            f"({spec.label.kind}) needs {spec.label.outputs}",
            mismatch_fix(
                spec.label.kind,
                f"end the model in a layer of {spec.label.outputs} unit(s) (spec.label.outputs)",
            ),
        )
    return outputs


def output_width(outputs: Any) -> int:
    """The values a model gives per example: its outputs' last dimension (1 for a vector)."""
    shape = outputs.shape
    return int(shape[-1]) if shape.rank and shape.rank > 1 else 1


def precision_failure(ref: str, manifest: Any, data_dir: str, policy: str) -> str | None:
    """Why the user's model does not build or run under the dtype `policy` (a mixed
    precision), in a line naming the layer (`Temperature.call: Input 'y' of 'Mul' Op has
    type float32 ...`); None where it does. The global policy is as it was after."""
    import keras

    from tfscale.tasks.data.inputs import build_dataset

    rows = max(1, min(8, manifest.splits["train"]))
    previous = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy(policy)
    try:
        model, objective = user_model(ref, manifest.spec)
        manifest = as_model_takes(manifest, model)
        batch = build_dataset(manifest, data_dir, "train", rows, training=False)
        features, labels = next(iter(batch))
        objective.loss(labels, model(features, training=True))
    except Exception as exc:  # noqa: BLE001 - the user's model: whatever it raises
        return _failure_line(exc.__cause__ or exc)
    finally:
        keras.mixed_precision.set_global_policy(previous)
    return None


def _failure_line(exc: BaseException) -> str:
    """A Keras layer's failure in one line: the layer's call and the error inside it."""
    import re

    text = plain(exc)
    layer = re.search(r"calling (\w+)\.call\(\)", text)
    inner = re.search(r"Error encountered:\s*\n\s*(.+)", text)
    cause = inner[1].strip() if inner else one_line(exc)
    return f"{layer[1]}.call: {cause}" if layer else f"{type(exc).__name__}: {cause}"


def _check_test_step(ref: str, model: Any) -> None:
    """A model's own `test_step` (an evaluation of its own, several passes with dropout
    on, say) is not what tfscale's held-out evaluation runs: refused before any training."""
    from tfscale.tasks.train.keras_meaning import own_test_step

    if own_test_step(model):
        raise ModelError(
            f"--model {ref} overrides test_step, its own evaluation; tfscale evaluates the "
            "held-out split as Keras's default test_step does (the model's call, its "
            "compiled loss and metrics), so the figures would not be its own",
            "remove test_step to be evaluated as Keras evaluates by default, and run your "
            "own evaluation with model.evaluate on the model.keras the run saves",
        )


def _check_fit_takes(ref: str, spec: FeatureSpec, train: Any, choice: Any) -> None:
    """Keras's `fit` under Mirrored takes no text input: TensorFlow fails as it distributes
    the batch (`AddN` of strings), after the model check and before a step."""
    text = [f.name for f in spec.features if f.dtype == "string"]
    if train.loop == "fit" and choice.replicas > 1 and text:
        raise ModelError(
            f"--model {ref} takes text ({', '.join(text)}), which Keras's fit under "
            f"{choice.kind} over {choice.replicas} replicas cannot distribute (TensorFlow "
            "has no AddN of strings)",
            "train it with tfscale's loop (--loop tfscale), which distributes text, or "
            "--loop fit on one device (--strategy one_device)",
        )


def _check_callbacks(ref: str, model: Any, manifest: Any, train: Any) -> None:
    """The callbacks the model's function gave (and `train.callbacks`'): each one
    tfscale's loop calls as `fit` calls it (`tasks.train.callbacks`), or refused here,
    before anything is measured, naming the model."""
    callbacks.configured(model, train.callbacks)
    found = callbacks.refused(model, manifest, train)
    if found is not None:
        raise ModelError(f"--model {ref}: its callback {found[0]}", found[1])


def _check_how_trained(ref: str, model: Any, train: Any, choice: Any) -> None:
    """What the run's strategy or accumulation would change of the model's meaning."""
    from tfscale.tasks.train.keras_meaning import not_cut_as_it_means, own_train_step

    if choice.spec.splits and (lost := not_cut_as_it_means(model)):
        raise ModelError(
            f"--model {ref}: a {choice.kind} cut trains each stage on the compiled loss "
            f"alone, without {', '.join(lost)}",
            "train it data-parallel (--strategy mirrored, multi_worker or one_device)",
        )
    if own_train_step(model) and train.grad_accum_steps > 1:
        raise ModelError(
            f"--model {ref}: its own train_step applies each batch's gradients itself, so "
            f"tfscale cannot accumulate {train.grad_accum_steps} micro-batches into a step",
            "set --grad-accum-steps 1, or raise the batch instead",
        )


def _check_own_step(ref: str, built: Built, features: Any, labels: Any) -> None:
    """A model's own `train_step`, run once on a few training examples: it runs, and it
    updates through `model.optimizer` (which tfscale replaces with its own, to set the
    rate by its rule and record the noise scale at its all-reduce)."""
    from tfscale.tasks.train.keras_meaning import attach, own_train_step

    model, objective = built
    if not own_train_step(model):
        return
    optimizer = getattr(model, "optimizer", None)
    before = int(optimizer.iterations.numpy()) if optimizer is not None else 0
    try:
        attach(built, optimizer, features, labels)  # its optimizer and metrics, as fit's
        model.train_step((features, objective.keras_labels(labels)))
    except Exception as exc:  # noqa: BLE001 - the user's step: whatever it raises
        raise ModelRaised(
            f"--model {ref}: its train_step raised {type(exc).__name__}: {one_line(exc)} "
            "(given (features, labels), as fit gives a dataset of pairs)",
            "fix the train_step (run again with --debug for the traceback)",
        ) from exc
    if optimizer is None or int(optimizer.iterations.numpy()) == before:
        others = _other_optimizers(model)
        raise ModelError(
            f"--model {ref}: its train_step does not update through model.optimizer"
            + (f" but through {', '.join(others)}" if others else ""),
            OWN_OPTIMIZERS_FIX,
        )


def _check_loss(ref: str, objective: Objective, labels: Any, outputs: Any) -> None:
    """The loss of a batch: computed, and finite; the outputs it is computed on finite first
    (a model that gives NaN or infinities before any training is not a loss's fault)."""
    import tensorflow as tf

    kind = objective.kind
    if not all(
        bool(tf.reduce_all(tf.math.is_finite(tf.cast(out, tf.float32))))
        for out in tf.nest.flatten(outputs)
        if out.dtype.is_floating
    ):
        raise ModelError(
            f"--model {ref}: its outputs on a first batch, before any training, are not all "
            "finite numbers (NaN or infinite)",
            "look at its initializers and at layers that can overflow float32 (a kernel "
            "initialised to huge values, an exp or a division without a guard)",
        )
    try:
        loss = objective.loss(labels, outputs)
        tf.debugging.assert_all_finite(tf.cast(loss, tf.float32), "loss")
    except Exception as exc:  # noqa: BLE001 - the user's loss: whatever it raises
        raise ModelError(
            f"--model {ref}: its loss does not fit the label's kind ({kind}): "
            f"{type(exc).__name__}: {one_line(exc)}",
            mismatch_fix(
                kind, f"compile it with a {KINDS[kind].loss} loss, or leave it uncompiled"
            ),
        ) from exc


def _check_target(objective: Objective, evaluate: Any) -> None:
    """The target metric is one the model reports (or one of Keras's)."""
    from tfscale.tasks.train.to_target import target_of

    target = target_of(evaluate, objective.label)
    if target.metric in (objective.label.score, "loss") or objective.metric(target.metric):
        return
    raise ModelError(
        f"evaluate.target_metric {target.metric}: the model does not report it; it reports "
        f"{', '.join(objective.metric_names())}",
        "name one of those (--target-metric), or compile the model with that metric",
    )


def _check_kind(ref: str, objective: Objective, kind: str) -> None:
    """A loss named for one kind of label, given another."""
    name = loss_name(objective.loss_fn)
    wrong = (kind != "class" and "categorical" in name) or (
        kind in ("class", "regression") and "binary" in name
    )
    if wrong:
        raise ModelError(
            f"--model {ref}: its loss ({name}) does not fit the label's kind ({kind})",
            mismatch_fix(
                kind, f"compile it with a {KINDS[kind].loss} loss, or leave it uncompiled"
            ),
        )


def _check_rebuilds(ref: str, model: Any) -> None:
    """The model and every layer rebuild from their config, as reading the saved model
    back does."""
    try:
        model.get_config()
    except NotImplementedError:
        raise ModelError(
            f"--model {ref}: the model {model.name} ({type(model).__name__}) has no "
            "get_config, so its trained file cannot be read back",
            "give the subclassed model a get_config returning its __init__ arguments, or "
            "write it as a functional model or a keras.Sequential",
        ) from None
    for layer in model.layers:
        try:
            type(layer).from_config(layer.get_config())
        except Exception as exc:  # noqa: BLE001 - the user's layer: whatever it raises
            raise ModelError(
                f"--model {ref}: its layer {layer.name} ({type(layer).__name__}) does not "
                f"rebuild from its config: {type(exc).__name__}: {one_line(exc)}",
                "give the layer a get_config returning its __init__ arguments (the trained "
                "model is saved and read back, and each process builds its own)",
            ) from None


def inputs_of(model: Any) -> str:
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):
        return "not known until called"
    return ", ".join(f"{getattr(i, 'name', '?')} {tuple(i.shape)}" for i in inputs or [])


def features_of(spec: FeatureSpec) -> str:
    return ", ".join(f"{f.name} {(None, *f.shape)} {f.dtype}" for f in spec.features)
