"""svc_annotation: Level-2's human annotation (R3, R18): a durable queue of items, annotators
scoring them over gRPC or a web page, drift tracked against gold items, and final rewards out."""
