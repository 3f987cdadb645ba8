"""The config file's sections, one module each: YAML value -> frozen section config."""
