"""``kvchaos explore``: generated fault schedules, each failure diagnosed, shrunk and deduplicated."""
