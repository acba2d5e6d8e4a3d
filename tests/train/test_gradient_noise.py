"""The gradient noise scale's norms, recorded in the training step: checked against the same
norms computed directly from each replica's and the whole batch's gradient, raw and with
Adam's preconditioning."""

from __future__ import annotations

import numpy as np
import pytest


def _model_and_data(seed: int = 0):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(5), keras.layers.Dense(3)])
    rng = np.random.default_rng(seed)
    images = rng.normal(size=(16, 6)).astype("float32")
    labels = rng.integers(0, 3, size=16).astype("int32")
    return model, images, labels


def _mean_gradient(model, images, labels) -> list[np.ndarray]:
    import keras
    import tensorflow as tf

    with tf.GradientTape() as tape:
        logits = model(images, training=True)
        loss = tf.reduce_mean(
            keras.losses.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        )
    return [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]


def _replica_slices(strategy, images, labels, replicas: int):
    """The 16 examples as each replica's share of them, in order."""
    per_replica = 16 // replicas
    return strategy.experimental_distribute_values_from_function(
        lambda ctx: (
            images[ctx.replica_id_in_sync_group * per_replica :][:per_replica],
            labels[ctx.replica_id_in_sync_group * per_replica :][:per_replica],
        )
    )


def _sq(grads, divisors=None) -> float:
    divisors = divisors or [1.0] * len(grads)
    return float(sum(np.sum((g / d) ** 2) for g, d in zip(grads, divisors, strict=True)))


@pytest.mark.parametrize("loop", ["tfscale", "fit"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_recorded_norms_are_the_micro_batches_and_the_all_reduced_gradients(
    replicas, loop, two_logical_cpus
):
    """Two steps on 16 examples: 2 replicas of 8 (Mirrored over 2 logical CPUs), or one
    device whose batch is split in halves of 8. The second step's norms, read apart, are
    the mean of the halves' squared gradient norms and the whole batch's, each computed
    here from the model's weights before that step; Adam's variant divides each gradient
    by sqrt(v_hat) + epsilon, v_hat from the first step's gradient alone. Under `--loop
    fit` each step is a `fit` call, Keras's step recording them (`fit_loop.NoiseRecording`)."""
    import tensorflow as tf

    from tfscale.tasks.data.spec import Label
    from tfscale.tasks.train.objectives import Built, Objective
    from tfscale.tasks.train.steps import FusedAdam, GradientNoise, replica_step

    devices = two_logical_cpus[:replicas]
    # as tfscale builds it: the CPU default's collective instances collide across strategies
    strategy = tf.distribute.MirroredStrategy(
        devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    model, images, labels = _model_and_data()
    with strategy.scope():
        model = type(model).from_config(model.get_config())
        model.set_weights(_model_and_data()[0].get_weights())
        adam = FusedAdam(1e-2)
        adam.build(model.trainable_variables)
    noise = GradientNoise(strategy, adam, replicas, 16 // replicas, 1, 16)
    assert (noise.small_batch, noise.big_batch, noise.split_batch) == (8, 16, replicas == 1)
    adam.noise = noise
    dataset = _replica_slices(strategy, images, labels, replicas)
    built = Built(model, Objective(Label("class")))

    @tf.function
    def step(batch):
        strategy.run(lambda x, y: replica_step(built, adam, (x, y), 1, 16, noise), args=batch)

    if loop == "fit":
        step = _fit_step(model, adam, noise, images, labels)
    first = _mean_gradient(model, images, labels)
    step(dataset)
    noise.read()  # the first step's (Adam's variant not counted: no v_hat yet)
    halves = [_mean_gradient(model, images[i : i + 8], labels[i : i + 8]) for i in (0, 8)]
    whole = _mean_gradient(model, images, labels)
    step(dataset)
    got = noise.read()
    assert got["steps"] == 1 and (got["small_batch"], got["big_batch"]) == (8, 16)
    assert got["small"] == pytest.approx(np.mean([_sq(h) for h in halves]), rel=1e-4)
    assert got["big"] == pytest.approx(_sq(whole), rel=1e-4)
    # Adam's second moment after one step: (1 - beta_2) g^2, unbiased by (1 - beta_2)
    precondition = [np.sqrt(g**2) + adam.epsilon for g in first]
    assert got["small_adam"] == pytest.approx(
        np.mean([_sq(h, precondition) for h in halves]), rel=1e-3
    )
    assert got["big_adam"] == pytest.approx(_sq(whole, precondition), rel=1e-3)
    assert got["small"] > got["big"]  # a smaller batch's gradient is noisier


def _fit_step(model, adam, noise, images, labels):
    """One step as `--loop fit` trains it: a `fit` call on the 16 examples (Keras gives
    each replica its share), recording the noise scale."""
    import keras
    import tensorflow as tf

    from tfscale.tasks.train.fit_loop import NoiseRecording

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model.compile(optimizer=adam, loss=loss)
    data = tf.data.Dataset.from_tensors((images, labels)).repeat()

    def step(_):
        recording = [NoiseRecording(noise)]
        model.fit(data, steps_per_epoch=1, verbose=0, shuffle=False, callbacks=recording)
        # Keras's own step is the model's again
        assert "train_step" not in vars(model) and model.train_function is not None

    return step


@pytest.mark.parametrize("precision", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("replicas, jit", [(1, False), (1, True), (2, False)])
def test_the_norms_are_recorded_under_every_precision(precision, replicas, jit, two_logical_cpus):
    """Under mixed precision (mixed_float16's loss scaling applies the update from a
    replica context of its own), on one device with and without XLA and on Mirrored: the
    second step's norms are recorded, and are those computed directly in float32 to the
    half-precision arithmetic's error."""
    import keras
    import tensorflow as tf

    from tfscale.tasks.data.spec import Label
    from tfscale.tasks.train.objectives import Built, Objective
    from tfscale.tasks.train.steps import FusedAdam, GradientNoise, replica_step

    strategy = tf.distribute.MirroredStrategy(
        two_logical_cpus[:replicas], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    model, images, labels = _model_and_data()
    keras.mixed_precision.set_global_policy(precision)
    try:
        with strategy.scope():
            mixed = type(model).from_config(model.get_config())
            mixed.set_weights(model.get_weights())
            adam = FusedAdam(1e-2)
            optimizer = adam
            if precision == "mixed_float16":
                optimizer = keras.optimizers.LossScaleOptimizer(adam)
            optimizer.build(mixed.trainable_variables)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    noise = GradientNoise(strategy, adam, replicas, 16 // replicas, 1, 16)
    adam.noise = noise
    dataset = _replica_slices(strategy, images, labels, replicas)

    def one(x, y):
        replica_step(Built(mixed, Objective(Label("class"))), optimizer, (x, y), 1, 16, noise)

    inner = tf.function(one, jit_compile=True) if jit else one

    @tf.function
    def step(batch):
        strategy.run(inner, args=batch)

    step(dataset)
    noise.read()
    model.set_weights(mixed.get_weights())  # the float32 copy, where the second step starts
    halves = [_mean_gradient(model, images[i : i + 8], labels[i : i + 8]) for i in (0, 8)]
    whole = _mean_gradient(model, images, labels)
    step(dataset)
    got = noise.read()
    assert got["steps"] == 1, got
    assert got["small"] == pytest.approx(np.mean([_sq(h) for h in halves]), rel=0.05)
    assert got["big"] == pytest.approx(_sq(whole), rel=0.05)
    assert got["small_adam"] is not None and got["big_adam"] is not None


def test_the_small_batch_is_a_half_batch_alone_and_a_micro_batch_with_accumulation(
    two_logical_cpus,
):
    """One replica of 32 splits into halves of 16; with 4 micro-batches of accumulation
    each micro-batch of 32 is the small batch (the replica's batch holds 4 x 32), and 2
    replicas at 32 compare 32 with 64; a lone replica's odd batch has no smaller one."""
    import tensorflow as tf

    from tfscale.tasks.train.steps import FusedAdam, GradientNoise

    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    adam = FusedAdam(1e-3)
    cases = {(1, 32, 1, 32): (16, 32, True), (1, 32, 4, 128): (32, 128, True)}
    cases |= {(2, 32, 1, 64): (32, 64, True), (1, 31, 1, 31): (31, 31, False)}
    for (replicas, per_replica, accum, effective), expected in cases.items():
        noise = GradientNoise(strategy, adam, replicas, per_replica, accum, effective)
        assert (noise.small_batch, noise.big_batch, noise.on) == expected


@pytest.mark.integration  # trains, times rounds or starts a process
def test_a_training_records_a_window_at_each_evaluation_and_plain_steps_after(digits, tmp_path):
    """Under Mirrored, every evaluation ends a window of the steps recorded since the last
    (one graph call in three records, as set); the noise scale's figures are finite; with
    `train.noise_scale: false` none are kept."""
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.settings.config import load_config
    from tfscale.tasks.train.training import train_model

    overrides, manifest, data_dir = digits
    values = {**overrides, "train.runs_dir": str(tmp_path / "runs"), "train.model": "mlp"}
    values |= {"train.strategy": "mirrored", "train.epochs": 2, "train.precision": "float32"}
    values |= {"train.jit_compile": False, "train.noise_scale_every": 3}
    report = detect_hardware()
    config = load_config(None, values)
    run = Run(config, manifest, data_dir, select_strategy(report, config.train), report)
    trained = train_model(run)
    windows, evaluations = trained.result.gradient_noise, trained.result.evaluations
    assert [w["end_step"] for w in windows] == [e["steps"] for e in evaluations]
    # one graph call of up to 10 steps in 3 records: the first, the fourth, ...
    recorded = sum(w["steps"] for w in windows)
    calls = -(-evaluations[-1]["steps"] // 10)
    assert 10 <= recorded <= 10 * -(-(calls + len(windows)) // 3)
    assert all(w["small"] > w["big"] > 0 for w in windows if w["steps"])
    assert all(w["small"] is None for w in windows if not w["steps"])
    assert (windows[0]["small_batch"], windows[0]["big_batch"]) == (32, 64)
    adam = trained.setup.optimizer
    assert adam.noise is None  # the measuring rounds after training time plain steps
    off = load_config(None, {**values, "train.noise_scale": False, "train.epochs": 1})
    plain = train_model(run.with_train(off.train)).result
    assert plain.gradient_noise == []


@pytest.mark.parametrize(
    ("rule", "kind", "noise", "got"),
    [
        ("linear", "mirrored", True, ("linear", False, 4.0)),
        ("sqrt", "mirrored", True, ("sqrt", False, 2.0)),
        ("none", "mirrored", True, ("none", False, 1.0)),
        ("adascale", "mirrored", True, ("adascale", True, 1.0)),  # from 1, then measured
        ("auto", "multi_worker", True, ("auto", True, 1.0)),
        ("auto", "parameter_server", True, ("sqrt", False, 2.0)),  # no noise scale there
        ("adascale", "mirrored", False, ("linear", False, 4.0)),  # train.noise_scale: false
    ],
)
def test_each_learning_rate_rule_at_four_times_the_base_batch(rule, kind, noise, got):
    from types import SimpleNamespace

    from tfscale.tasks.settings.config import load_config
    from tfscale.tasks.settings.kinds import kind_of
    from tfscale.tasks.train.noise_estimates import static_gain
    from tfscale.tasks.train.training import learning_rate_rule

    cfg = load_config(None, {"train.lr_scaling": rule, "train.noise_scale": noise}).train
    rate = learning_rate_rule(cfg, SimpleNamespace(kind=kind, spec=kind_of(kind)), 4.0)
    applied, adaptive = rate.rule, rate.adaptive
    assert (applied, adaptive, static_gain(applied, 4.0)) == got
    none = learning_rate_rule(cfg, SimpleNamespace(kind=kind, spec=kind_of(kind)), 1.0)
    assert (none.rule, none.adaptive) == ("none", False)


def test_adascales_gain_follows_the_noise_scale_and_auto_takes_its_square_root():
    """Windows planted at noise scale 32 (|G|^2 1, tr(S) 32) for batch 64 against the base
    rate's 32: AdaScale's gain is 2 x (32+32)/(32+64) = 1.33, Adam's rule 1.15; a window
    that recorded no step changes nothing."""
    import tensorflow as tf

    from tfscale.tasks.train.noise_estimates import AdaptiveGain

    window = {"steps": 10, "small_batch": 32, "big_batch": 64}
    window |= {"small": 1 + 32 / 32, "big": 1 + 32 / 64}
    for sqrt, expected in ((False, 4 / 3), (True, (4 / 3) ** 0.5)):
        variable = tf.Variable(1.0)
        gain = AdaptiveGain(variable, 32, 64, sqrt)
        assert gain.update({"steps": 0, "small": None}) is None and float(variable) == 1.0
        assert gain.update(window) == pytest.approx(expected)
        assert float(variable) == pytest.approx(expected)


@pytest.mark.integration  # trains, times rounds or starts a process
def test_an_adascale_training_sets_its_rate_from_the_noise_scale_it_measures(digits, tmp_path):
    """Mirrored over 2 logical CPUs at 32 a replica (64 against the base rate's 32),
    `train.lr_scaling: adascale`: each window that recorded steps sets the gain, between 1
    and 2, and after the warm-up the optimizer's rate is the base rate times the last."""
    from tfscale.tasks.distribute.hardware import detect_hardware
    from tfscale.tasks.distribute.run import Run
    from tfscale.tasks.distribute.strategy import select_strategy
    from tfscale.tasks.settings.config import load_config
    from tfscale.tasks.train.training import train_model

    overrides, manifest, data_dir = digits
    values = {**overrides, "train.runs_dir": str(tmp_path / "runs"), "train.model": "mlp"}
    values |= {"train.strategy": "mirrored", "train.epochs": 3, "train.precision": "float32"}
    values |= {"train.jit_compile": False, "train.noise_scale_every": 2}
    values |= {"train.lr_scaling": "adascale", "train.warmup_epochs": 1}
    report = detect_hardware()
    config = load_config(None, values)
    run = Run(config, manifest, data_dir, select_strategy(report, config.train), report)
    trained = train_model(run)
    result = trained.result
    gains = [w["lr_gain"] for w in result.gradient_noise if w["steps"]]
    assert result.lr_scaling == "adascale" and gains and all(1.0 <= g <= 2.0 for g in gains)
    optimizer = trained.setup.optimizer
    rate = float(optimizer.learning_rate)  # the schedule at the optimizer's step
    assert rate == pytest.approx(0.001 * gains[-1], rel=1e-5)
