"""The examples as smoke runs (training parity, checkpoint resume, the recommender)."""
