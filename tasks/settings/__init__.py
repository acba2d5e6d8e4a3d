"""Layer 2, what a user may ask for: the typed, frozen config read from `params.yaml` and
flags (`config`), and the table of strategy kinds it may name (`kinds`), with the builders
of the `tf.distribute` strategies themselves (`build_one_device` to `build_tpu`, each
importing TensorFlow only when called). The kinds' pipeline builders and epoch runners
live in the layers that own them and are bound late, by name (the layout test reads
those names)."""
