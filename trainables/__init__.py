"""What runs inside one trial: engine actors, the pool with its router, replay, and the Tune trainable."""
