"""The ``EndpointPickerConfig``: schema, two-phase loader, YAML with line numbers, error locations, reload, feature gates, units."""
