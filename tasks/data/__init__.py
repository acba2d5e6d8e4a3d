"""Layer 3, the data: sources (digits, synthetic, image folders, tensorflow-datasets), the
prepare step writing sharded TFRecords with a checksummed manifest, and the tf.data input
pipeline a training reads them through."""
