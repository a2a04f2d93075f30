"""Repository-level pytest configuration: nothing here is needed by users of the plugin."""
