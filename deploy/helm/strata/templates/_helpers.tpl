{{/* The chart's name, overridable. */}}
{{- define "strata.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's full name: <release>-<chart>, or the release alone when it holds the chart's name. */}}
{{- define "strata.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "strata.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "strata.labels" -}}
helm.sh/chart: {{ include "strata.chart" . }}
{{ include "strata.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: strata
{{- end }}

{{- define "strata.selectorLabels" -}}
app.kubernetes.io/name: {{ include "strata.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "strata.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "strata.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "strata.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag | toString) }}
{{- end }}

{{/* A service's component name from its values key: generatorL1 -> generator-l1. */}}
{{- define "strata.component" -}}
{{- . | replace "generatorL" "generator-l" }}
{{- end }}

{{/* Whether a service (dict: root, svc) gets a GPU: "true" or "". */}}
{{- define "strata.wantsGpu" -}}
{{- if and .root.Values.gpu.enabled .svc.gpu }}true{{ end }}
{{- end }}

{{/* The Secret holding the Kafka SASL password, "" when none. */}}
{{- define "strata.kafkaSecret" -}}
{{- if hasPrefix "SASL_" .Values.kafka.securityProtocol }}
{{- default .Values.existingSecret .Values.kafka.sasl.existingSecret }}
{{- end }}
{{- end }}

{{/* The Secret holding the Redis password, "" when none (or redis.passwordKey is empty). */}}
{{- define "strata.redisSecret" -}}
{{- if .Values.redis.passwordKey }}
{{- default .Values.existingSecret .Values.redis.existingSecret }}
{{- end }}
{{- end }}

{{/* Values that cannot work, refused at render time with the value to change. */}}
{{- define "strata.validate" -}}
{{- $protocol := .Values.kafka.securityProtocol }}
{{- if not (has $protocol (list "PLAINTEXT" "SASL_PLAINTEXT" "SSL" "SASL_SSL")) }}
{{- fail (printf "kafka.securityProtocol %q: expected PLAINTEXT, SASL_PLAINTEXT, SSL or SASL_SSL" $protocol) }}
{{- end }}
{{- if and (hasPrefix "SASL_" $protocol) (or (not .Values.kafka.sasl.username) (not (include "strata.kafkaSecret" .))) }}
{{- fail (printf "kafka.securityProtocol %s needs kafka.sasl.username and a Secret with the password (kafka.sasl.existingSecret or existingSecret)" $protocol) }}
{{- end }}
{{- if and .Values.kafka.tls.caSecret (not (hasSuffix "SSL" $protocol)) }}
{{- fail "kafka.tls.caSecret needs kafka.securityProtocol SSL or SASL_SSL" }}
{{- end }}
{{- if gt (int .Values.kafka.minInsyncReplicas) (int .Values.kafka.replicationFactor) }}
{{- fail (printf "kafka.minInsyncReplicas %v is more than kafka.replicationFactor %v" .Values.kafka.minInsyncReplicas .Values.kafka.replicationFactor) }}
{{- end }}
{{- if not .Values.kafka.bootstrap }}
{{- fail "kafka.bootstrap is required: the host:port list of the Kafka cluster (the chart runs none)" }}
{{- end }}
{{- if and (not .Values.redis.sentinel.addresses) (not (regexMatch "^rediss?://[^@]+$" (.Values.redis.url | toString))) }}
{{- fail "redis.url must be redis://host:port/db or rediss://..., without credentials (they come from redis.existingSecret)" }}
{{- end }}
{{- if ne (empty .Values.redis.sentinel.addresses) (empty .Values.redis.sentinel.master) }}
{{- fail "redis.sentinel.addresses and redis.sentinel.master go together: set both or neither" }}
{{- end }}
{{- if not .Values.gpu.enabled }}
{{- range $key, $svc := .Values.services }}
{{- range $name, $value := $svc.env }}
{{- if and $svc.enabled (hasPrefix "cuda" ($value | toString)) }}
{{- fail (printf "gpu.enabled is false but services.%s.env.%s is %s: install with -f values-cpu.yaml" $key $name $value) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The environment of a Strata container (dict: root, svc; no svc: the topics Job). Secret-backed
variables come first: STRATA_REDIS_URL refers to STRATA_REDIS_PASSWORD as $(STRATA_REDIS_PASSWORD),
which Kubernetes expands only from variables defined before it. No password is rendered as a value.
*/}}
{{- define "strata.env" -}}
{{- $root := .root }}
{{- $v := $root.Values }}
{{- $kafkaSecret := include "strata.kafkaSecret" $root }}
{{- $redisSecret := include "strata.redisSecret" $root }}
{{- if $kafkaSecret }}
- name: STRATA_KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $kafkaSecret }}
      key: {{ $v.kafka.sasl.passwordKey }}
{{- end }}
{{- if $redisSecret }}
- name: STRATA_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $redisSecret }}
      key: {{ $v.redis.passwordKey }}
{{- end }}
- name: STRATA_KAFKA_BOOTSTRAP
  value: {{ $v.kafka.bootstrap | quote }}
- name: STRATA_KAFKA_SECURITY_PROTOCOL
  value: {{ $v.kafka.securityProtocol | quote }}
{{- if hasPrefix "SASL_" $v.kafka.securityProtocol }}
- name: STRATA_KAFKA_SASL_MECHANISM
  value: {{ $v.kafka.sasl.mechanism | quote }}
- name: STRATA_KAFKA_SASL_USERNAME
  value: {{ $v.kafka.sasl.username | quote }}
{{- end }}
{{- if $v.kafka.tls.caSecret }}
- name: STRATA_KAFKA_SSL_CAFILE
  value: /etc/strata/kafka-ca/{{ $v.kafka.tls.caKey }}
{{- end }}
{{- if $v.redis.waitReplicas }}
- name: STRATA_REDIS_WAIT_REPLICAS
  value: {{ $v.redis.waitReplicas | quote }}
{{- end }}
{{- if $v.redis.sentinel.addresses }}
{{- /* Sentinel: no STRATA_REDIS_URL (Strata refuses both); the login of the data nodes as settings. */}}
- name: STRATA_REDIS_SENTINELS
  value: {{ $v.redis.sentinel.addresses | quote }}
- name: STRATA_REDIS_SENTINEL_PRIMARY
  value: {{ $v.redis.sentinel.master | quote }}
{{- if and $redisSecret $v.redis.username }}
- name: STRATA_REDIS_USERNAME
  value: {{ $v.redis.username | quote }}
{{- end }}
{{- else if $redisSecret }}
{{- /* An external Redis takes its login in the URL: Kubernetes puts the password in from the Secret. */}}
{{- $parts := splitn "://" 2 $v.redis.url }}
- name: STRATA_REDIS_URL
  value: {{ printf "%s://%s:$(STRATA_REDIS_PASSWORD)@%s" $parts._0 $v.redis.username $parts._1 | quote }}
{{- else }}
- name: STRATA_REDIS_URL
  value: {{ $v.redis.url | quote }}
{{- end }}
- name: STRATA_TOPIC_PARTITIONS
  value: {{ $v.kafka.partitions | quote }}
- name: STRATA_TOPIC_REPLICATION_FACTOR
  value: {{ $v.kafka.replicationFactor | quote }}
- name: STRATA_TOPIC_MIN_INSYNC_REPLICAS
  value: {{ $v.kafka.minInsyncReplicas | quote }}
- name: STRATA_CACHE_DIR
  value: /models
{{- if .svc }}
# Probes and other pods reach the ports across the pod network.
- name: STRATA_GRPC_BIND_HOST
  value: 0.0.0.0
{{- if $v.metrics.enabled }}
- name: STRATA_METRICS_BIND_HOST
  value: 0.0.0.0
- name: STRATA_METRICS_PORT
  value: {{ .svc.metricsPort | quote }}
{{- end }}
{{- if $v.grpcTokens.existingSecret }}
- name: STRATA_GRPC_TOKENS_FILE
  value: /etc/strata/grpc-tokens/{{ $v.grpcTokens.key }}
{{- end }}
{{- end }}
{{- $env := deepCopy ($v.env | default dict) }}
{{- if .svc }}
{{- $env = mergeOverwrite $env (deepCopy (.svc.env | default dict)) }}
{{- end }}
{{- range $name, $value := $env }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
