"""svc_probe: the Level-0 probe (R1). Proposes response directions; never writes the answer."""
