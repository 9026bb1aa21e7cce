"""svc_generator: Level-1 and Level-2 generation (R2, R3, R15); one service, deployed per tier."""
