"""The extender's configuration: one YAML file, environment overrides, full validation,
atomic swap.

- :mod:`extender.config.sections`: the settings, one frozen dataclass per section;
- :mod:`extender.config.schema`: each section's accepted types and ranges, and
  ``build_config`` (every problem with its path, ``ConfigError``);
- :mod:`extender.config.loader`: ``load_config`` (file, packaged default,
  ``TANDEM__SECTION__KEY`` overrides) and ``ConfigHolder`` (the live config, swapped
  on reload).
"""
