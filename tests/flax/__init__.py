"""The Flax NNX and Linen modules, the precision policy and the hand-offs inside the MLP."""
