#!/bin/sh
# The image's command: server.properties from the KAFKA_* environment (as apache/kafka reads it),
# storage formatted once (CLUSTER_ID, or the official image's default id), then the broker.
set -eu
props=/opt/kafka/config/server.properties
: > "$props"
env | sort | while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS|KAFKA_OPTS|KAFKA_LOG4J_OPTS|KAFKA_JVM_PERFORMANCE_OPTS|KAFKA_JMX_OPTS|KAFKA_GC_LOG_OPTS) ;;
    KAFKA_*)
      key=$(printf '%s' "${name#KAFKA_}" | tr 'A-Z' 'a-z' | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g')
      printf '%s=%s\n' "$key" "$value" >> "$props" ;;
  esac
done
grep -q '^log.dirs=' "$props" || echo "log.dirs=/var/lib/kafka/data" >> "$props"
echo "kafka: $(wc -l < "$props") properties from the environment"
/opt/kafka/bin/kafka-storage.sh format --cluster-id="${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" -c "$props" --ignore-formatted
exec /opt/kafka/bin/kafka-run-class.sh kafka.Kafka "$props"
