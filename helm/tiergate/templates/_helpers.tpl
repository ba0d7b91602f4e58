{{- define "tiergate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tiergate.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tiergate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "tiergate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "tiergate.selector" -}}
app.kubernetes.io/name: {{ include "tiergate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tiergate.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "tiergate.secretName" -}}
{{- .Values.secret.existingSecret | default (printf "%s-secrets" (include "tiergate.fullname" .)) -}}
{{- end -}}

{{/* The headless Service of a tier's vLLM pool; the gateway discovers endpoints through it. */}}
{{- define "tiergate.vllmHeadless" -}}
{{- printf "%s-vllm-%s" (include "tiergate.fullname" .root) .tier -}}
{{- end -}}

{{- define "tiergate.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* A tier's speculative settings as vLLM's --speculative-config JSON ("" when none). */}}
{{- define "tiergate.speculativeConfig" -}}
{{- $s := . -}}
{{- if and $s (ne $s.method "none") -}}
{{- $out := dict "method" $s.method -}}
{{- with $s.numSpeculativeTokens }}{{- $_ := set $out "num_speculative_tokens" . -}}{{- end -}}
{{- if has $s.method (list "draft_model" "eagle3") -}}{{- $_ := set $out "model" $s.model -}}{{- end -}}
{{- if eq $s.method "ngram" -}}
{{- $n := $s.ngram | default dict -}}
{{- $_ := set $out "prompt_lookup_max" ($n.promptLookupMax | default 4) -}}
{{- $_ := set $out "prompt_lookup_min" ($n.promptLookupMin | default 2) -}}
{{- end -}}
{{- $out | toJson -}}
{{- end -}}
{{- end -}}

{{/* A component's service account name. */}}
{{- define "tiergate.serviceAccountName" -}}
{{- $sa := .sa -}}
{{- if $sa.create -}}
{{- $sa.name | default (printf "%s-%s" (include "tiergate.fullname" .root) .component) -}}
{{- else -}}
{{- $sa.name | default "default" -}}
{{- end -}}
{{- end -}}

{{/* Secret names: the keys, the engines' key, Redis, static storage keys. */}}
{{- define "tiergate.authSecret" -}}
{{- .Values.auth.existingSecret | default (printf "%s-auth" (include "tiergate.fullname" .)) -}}
{{- end -}}

{{- define "tiergate.engineSecret" -}}
{{- .Values.vllm.apiKey.existingSecret | default (printf "%s-engine" (include "tiergate.fullname" .)) -}}
{{- end -}}

{{- define "tiergate.engineSecretKey" -}}
{{- if .Values.vllm.apiKey.existingSecret }}{{ .Values.vllm.apiKey.existingSecretKey }}{{ else }}engine-api-key{{ end -}}
{{- end -}}

{{- define "tiergate.storageSecret" -}}
{{- .Values.jobs.storage.staticCredentials.existingSecret | default (printf "%s-storage" (include "tiergate.fullname" .)) -}}
{{- end -}}

{{- define "tiergate.storageStatic" -}}
{{- $c := .Values.jobs.storage.staticCredentials -}}
{{- if or $c.existingSecret $c.accessKeyId }}true{{ end -}}
{{- end -}}

{{/* The Redis the limits use: "" (none), "chart" (the chart's), "url" (limits.redisUrl) or
"secret" (limits.existingSecret). */}}
{{- define "tiergate.redisSource" -}}
{{- if .Values.limits.existingSecret }}secret
{{- else if .Values.limits.redisUrl }}url
{{- else if .Values.redis.enabled }}chart
{{- end -}}
{{- end -}}

{{/* The Secret (and its key) holding the limits' Redis URL, which may carry a password and
so never goes into the gateway's ConfigMap: limits.existingSecret, or the one the chart
makes from limits.redisUrl. */}}
{{- define "tiergate.redisUrlSecret" -}}
{{- .Values.limits.existingSecret | default (printf "%s-redis-url" (include "tiergate.fullname" .)) -}}
{{- end -}}

{{- define "tiergate.redisUrlSecretKey" -}}
{{- if .Values.limits.existingSecret }}{{ .Values.limits.existingSecretKey }}{{ else }}redis-url{{ end -}}
{{- end -}}

{{/* A Kubernetes memory quantity ("8Gi", "8704Mi", "9G", "1073741824") in whole MiB. */}}
{{- define "tiergate.mebibytes" -}}
{{- $q := toString . -}}
{{- $number := regexFind "^[0-9]+(\\.[0-9]+)?" $q -}}
{{- $unit := trimPrefix $number $q -}}
{{- $per := dict "" 1 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 -}}
{{- if or (not $number) (not (hasKey $per $unit)) -}}
{{- fail (printf "memory quantity %q: expected a number with one of Ki, Mi, Gi, Ti, k, M, G, T" $q) -}}
{{- end -}}
{{- floor (divf (mulf (float64 $number) (index $per $unit)) 1048576) | int -}}
{{- end -}}

{{/* Refuse a worker pod whose memory limit leaves no headroom: each of the worker's
jobs.worker.concurrency jobs may use up to the installation's cap (gateway.config's
jobs.caps.memory_mb, 4096 unless set: tiergate/jobsettings.py's JobCaps), and the worker
process itself needs jobs.worker.memoryHeadroomMi beside them, else the kernel kills the
worker (and every job in it) instead of the one job over its limit. */}}
{{- define "tiergate.checkWorkerMemory" -}}
{{- $w := .Values.jobs.worker -}}
{{- $limit := dig "limits" "memory" "" ($w.resources | default dict) -}}
{{- if $limit -}}
{{- $cap := dig "jobs" "caps" "memory_mb" 4096 (.Values.gateway.config | default dict) | int -}}
{{- $concurrency := (include "tiergate.workerConfig" . | fromYaml).jobs.worker.concurrency | int -}}
{{- $need := add (mul $concurrency $cap) (int $w.memoryHeadroomMi) -}}
{{- $have := include "tiergate.mebibytes" $limit | int -}}
{{- if lt $have $need -}}
{{- fail (printf "jobs.worker.resources.limits.memory (%s = %d Mi) leaves no headroom: jobs.worker.concurrency (%d) x jobs.caps.memory_mb (%d) + jobs.worker.memoryHeadroomMi (%d) = %d Mi. Raise the limit, or lower the concurrency or gateway.config.jobs.caps.memory_mb." (toString $limit) $have $concurrency $cap (int $w.memoryHeadroomMi) $need) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A seccomp or AppArmor profile (.p) as the API takes it: localhostProfile only with
type Localhost (so that overriding the type alone never leaves the default's file name). */}}
{{- define "tiergate.securityProfile" -}}
type: {{ .p.type }}
{{- if eq .p.type "Localhost" }}
{{- if not .p.localhostProfile }}
{{- fail (printf "%s: type Localhost needs localhostProfile (the profile installed on the nodes)" .where) }}
{{- end }}
localhostProfile: {{ .p.localhostProfile | quote }}
{{- end }}
{{- end -}}

{{/* Whether anyone outside the cluster can reach the gateway. */}}
{{- define "tiergate.public" -}}
{{- if or .Values.gateway.ingress.enabled (has .Values.gateway.service.type (list "LoadBalancer" "NodePort")) }}true{{ end -}}
{{- end -}}

{{/* The tuning image: vLLM and tiergate in one. */}}
{{- define "tiergate.tuningImage" -}}
{{ .Values.tuning.image.repository }}:{{ .Values.tuning.image.tag | default (printf "%s-%s" .Chart.AppVersion .Values.vllm.image.tag) }}
{{- end -}}

{{- define "tiergate.decisionDir" -}}
/models/tiergate/decisions/{{ .Values.tuning.hardware.name }}
{{- end -}}

{{/* The tiers (tiergate/tiers.py), space-separated, in the order the chart renders them:
the one place in the chart that names them, so that templates range over
`splitList " " (include "tiergate.tierList" .)` instead of a literal list. */}}
{{- define "tiergate.tierList" -}}standard fast{{- end -}}

{{/* The vLLM Deployments' component labels, as a YAML flow list. */}}
{{- define "tiergate.vllmComponents" -}}
[{{ range $i, $tier := splitList " " (include "tiergate.tierList" .) }}{{ if $i }}, {{ end }}vllm-{{ $tier }}{{ end }}]
{{- end -}}

{{/* Whether the fast tier is gated by the tuner's decision. */}}
{{- define "tiergate.tunedFast" -}}
{{- if and .Values.tuning.enabled .Values.vllm.tiers.fast.enabled }}true{{ end -}}
{{- end -}}

{{/* Kafka's part of the settings tree (jobs.kafka), shared by the gateway and workers. */}}
{{- define "tiergate.kafkaConfig" -}}
{{- $k := .Values.jobs.kafka -}}
bootstrap_servers: {{ $k.bootstrapServers | quote }}
topic: {{ $k.topic | quote }}
group: {{ $k.consumerGroup | quote }}
partitions: {{ $k.partitions }}
{{- if not (kindIs "invalid" $k.replicationFactor) }}
replication_factor: {{ $k.replicationFactor }}
{{- end }}
{{- $sec := $k.security }}
{{- if ne $sec.protocol "PLAINTEXT" }}
security_protocol: {{ $sec.protocol }}
{{- if hasPrefix "SASL_" $sec.protocol }}
sasl_mechanism: {{ $sec.saslMechanism }}
{{- end }}
{{- if $sec.caKey }}
ssl_cafile: /etc/tiergate/kafka/ca.crt
{{- end }}
{{- end }}
{{- end -}}

{{- define "tiergate.jobsConfig" -}}
enabled: true
gateway_url: http://{{ include "tiergate.fullname" . }}-gateway:{{ .Values.gateway.service.port }}
kafka:
  {{- include "tiergate.kafkaConfig" . | nindent 2 }}
storage:
  endpoint_url: {{ .Values.jobs.storage.endpointUrl | quote }}
  bucket: {{ .Values.jobs.storage.bucket | quote }}
  region: {{ .Values.jobs.storage.region | quote }}
{{- end -}}

{{/* Refuse secrets and chart-owned settings in a values settings tree (.cfg at .where). */}}
{{- define "tiergate.checkConfig" -}}
{{- $cfg := .cfg | default dict -}}
{{- $auth := $cfg.auth | default dict -}}
{{- if hasKey $auth "keys" -}}
{{- fail (printf "%s.auth.keys: API keys go in auth.keys (hashes) or auth.existingSecret, from which the chart passes them to the gateway" .where) -}}
{{- end -}}
{{- if hasKey $auth "enabled" -}}
{{- fail (printf "%s.auth.enabled: use auth.enabled" .where) -}}
{{- end -}}
{{- range $tier, $pool := ($cfg.tiers | default dict) -}}
{{- if hasKey ($pool | default dict) "api_key" -}}
{{- fail (printf "%s.tiers.%s.api_key: the engines' key comes from a Secret (vllm.apiKey)" $.where $tier) -}}
{{- end -}}
{{- end -}}
{{- $jobs := $cfg.jobs | default dict -}}
{{- if hasKey ($jobs.worker | default dict) "api_key" -}}
{{- fail (printf "%s.jobs.worker.api_key: the workers' key comes from the auth Secret" .where) -}}
{{- end -}}
{{- end -}}

{{/* The gateway's settings file: what the chart derives, gateway.config over it, then the
settings the chart's own manifests depend on. */}}
{{- define "tiergate.gatewayConfig" -}}
{{- $root := . -}}
{{- $g := .Values.gateway -}}
{{- include "tiergate.checkConfig" (dict "cfg" $g.config "where" "gateway.config") -}}
{{- $window := sub (int $g.terminationGracePeriodSeconds) (int $g.preStopSeconds) -}}
{{- $base := include "tiergate.gatewayBase" . | fromYaml -}}
{{- $cfg := mustMergeOverwrite $base (deepCopy ($g.config | default dict)) -}}
{{- $enforced := dict "gateway" (dict "host" "0.0.0.0" "port" $g.port "metrics_port" $g.metricsPort) "auth" (dict "enabled" .Values.auth.enabled) -}}
{{- $cfg = mustMergeOverwrite $cfg $enforced -}}
{{- $grace := $cfg.gateway.shutdown_grace_seconds -}}
{{- if gt (float64 $grace) (float64 $window) -}}
{{- fail (printf "gateway.config.gateway.shutdown_grace_seconds (%v) must fit in terminationGracePeriodSeconds - preStopSeconds (%d)" $grace $window) -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "tiergate.gatewayBase" -}}
{{- $root := . -}}
{{- $g := .Values.gateway -}}
gateway:
  shutdown_grace_seconds: {{ max 0 (sub (sub (int $g.terminationGracePeriodSeconds) (int $g.preStopSeconds)) 5) }}
tiers:
{{- range $tier := splitList " " (include "tiergate.tierList" $root) }}
{{- $cfg := index $root.Values.vllm.tiers $tier }}
  {{ $tier }}:
  {{- if $cfg.enabled }}
    dns:
      name: {{ include "tiergate.vllmHeadless" (dict "root" $root "tier" $tier) }}.{{ $root.Release.Namespace }}.svc.cluster.local
      port: {{ $root.Values.vllm.port }}
      refresh_seconds: {{ $g.dnsRefreshSeconds }}
  {{- else }}
    endpoints: []
  {{- end }}
{{- end }}
{{- if .Values.jobs.enabled }}
jobs:
  {{- include "tiergate.jobsConfig" . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The workers' settings file. What the chart sizes around the worker (its grace period,
its memory check, KEDA's trigger) is read back from this, never from the values it starts
from, so that a jobs.worker.config override reaches those too (and validate.yaml keeps
jobs.worker.extraEnv from overriding them behind the file's back). */}}
{{- define "tiergate.workerConfig" -}}
{{- $w := .Values.jobs.worker -}}
{{- include "tiergate.checkConfig" (dict "cfg" $w.config "where" "jobs.worker.config") -}}
{{- $base := include "tiergate.workerBase" . | fromYaml -}}
{{- $cfg := mustMergeOverwrite $base (deepCopy ($w.config | default dict)) -}}
{{- $cfg = mustMergeOverwrite $cfg (dict "jobs" (dict "enabled" true "worker" (dict "metrics_port" $w.metrics.port))) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The worker pod's terminationGracePeriodSeconds: SIGTERM starts the worker's drain
(jobs.worker.drain_seconds for running jobs to finish), after which it abandons the rest
(their sandboxes killed, their messages uncommitted, so they run again elsewhere) and
exits; the margin is for that, so that the kubelet's SIGKILL never cuts a drain short. A
grace period set in values must at least hold the drain. */}}
{{- define "tiergate.workerGrace" -}}
{{- $set := .Values.jobs.worker.terminationGracePeriodSeconds -}}
{{- $drain := (include "tiergate.workerConfig" . | fromYaml).jobs.worker.drain_seconds | float64 -}}
{{- if kindIs "invalid" $set -}}
{{- add (ceil $drain | int) 30 -}}
{{- else if lt (float64 $set) $drain -}}
{{- fail (printf "jobs.worker.terminationGracePeriodSeconds (%v) is shorter than the workers' drain (jobs.worker.drain_seconds = %v): Kubernetes would kill a draining worker, and its running jobs, before the drain ends. Leave it unset (the drain + 30 s) or raise it." $set $drain) -}}
{{- else -}}
{{- $set -}}
{{- end -}}
{{- end -}}

{{- define "tiergate.workerBase" -}}
{{- $w := .Values.jobs.worker -}}
jobs:
  {{- include "tiergate.jobsConfig" . | nindent 2 }}
  worker:
    concurrency: {{ $w.concurrency }}
    drain_seconds: {{ $w.drainSeconds }}
  sandbox:
    allow_unlimited: {{ $w.allowUnlimitedSandbox }}
{{- end -}}

{{/* The tuner's settings file (the tuning Job and the fast tier's gate read the same). */}}
{{- define "tiergate.tuningConfig" -}}
{{- $t := .Values.tuning -}}
{{- include "tiergate.checkConfig" (dict "cfg" $t.config "where" "tuning.config") -}}
{{- $base := include "tiergate.tuningBase" . | fromYaml -}}
{{- $cfg := mustMergeOverwrite $base (deepCopy ($t.config | default dict)) -}}
{{- $decision := printf "%s/tier-decision.json" (include "tiergate.decisionDir" .) -}}
{{- $cfg = mustMergeOverwrite $cfg (dict "tuning" (dict "decision_file" $decision)) -}}
{{- toYaml $cfg -}}
{{- end -}}

{{- define "tiergate.tuningBase" -}}
{{- $root := . -}}
{{- $t := .Values.tuning -}}
{{- $standard := .Values.vllm.tiers.standard -}}
profiles:
{{- range $i, $tier := splitList " " (include "tiergate.tierList" $root) }}
{{- $cfg := index $root.Values.vllm.tiers $tier }}
  {{ $tier }}:
    model: {{ $standard.model | quote }}
    {{- if eq $tier "fast" }}
    tuned: true
    {{- end }}
    served_model_name: {{ $root.Values.vllm.servedModelName | quote }}
    host: 127.0.0.1
    port: {{ add 8101 $i }}
    dtype: {{ $cfg.dtype | quote }}
    max_model_len: {{ $cfg.maxModelLen | default "null" }}
    enforce_eager: {{ $t.enforceEager }}
    cpu_cores: {{ index $t.cpuCores $tier | quote }}
    extra_args: {{ concat $t.engineExtraArgs $cfg.extraArgs | toJson }}
{{- end }}
tuning:
  budget_seconds: {{ $t.budgetSeconds }}
  # The Job's engines measure in the mode the fast tier's pods serve in (tuning.enforceEager).
  screen_eager: false
{{- end -}}

{{/* The Secret with a component's Kafka credentials (.root, .component: gateway, worker,
keda or environments): its own (jobs.kafka.security.components; KEDA's falls back to the
workers'), else the shared existingSecret. The environments build reaches no broker. */}}
{{- define "tiergate.kafkaSecret" -}}
{{- $sec := .root.Values.jobs.kafka.security -}}
{{- $own := dict "gateway" $sec.components.gateway "worker" $sec.components.worker "keda" (default $sec.components.worker $sec.components.keda) -}}
{{- if ne .component "environments" -}}
{{- default $sec.existingSecret (get $own .component) -}}
{{- end -}}
{{- end -}}

{{/* The Secret with a component's static object-storage keys (.root, .component: gateway,
worker or environments): its own (jobs.storage.staticCredentials.components), else the
shared one; "" when the store is reached by workload identity. */}}
{{- define "tiergate.storageSecretOf" -}}
{{- $c := .root.Values.jobs.storage.staticCredentials -}}
{{- $own := get $c.components .component -}}
{{- if $own }}{{ $own }}
{{- else if include "tiergate.storageStatic" .root }}{{ include "tiergate.storageSecret" .root }}
{{- end -}}
{{- end -}}

{{/* The environment a component (.root, .component) needs for jobs: its Kafka SASL
credentials and static object-storage keys, each only when configured, and each the
component's own where the operator gave it one (least privilege: README.md beside this
chart, "Kafka and storage identities"). */}}
{{- define "tiergate.jobsEnv" -}}
{{- $sec := .root.Values.jobs.kafka.security -}}
{{- $kafka := include "tiergate.kafkaSecret" . -}}
{{- if and (hasPrefix "SASL_" $sec.protocol) $kafka }}
- name: TIERGATE_JOBS__KAFKA__SASL_USERNAME
  valueFrom: {secretKeyRef: {name: {{ $kafka }}, key: {{ $sec.usernameKey }}}}
- name: TIERGATE_JOBS__KAFKA__SASL_PASSWORD
  valueFrom: {secretKeyRef: {name: {{ $kafka }}, key: {{ $sec.passwordKey }}}}
{{- end }}
{{- with include "tiergate.storageSecretOf" . }}
- name: AWS_ACCESS_KEY_ID
  valueFrom: {secretKeyRef: {name: {{ . }}, key: AWS_ACCESS_KEY_ID}}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom: {secretKeyRef: {name: {{ . }}, key: AWS_SECRET_ACCESS_KEY}}
{{- end }}
{{- end -}}

{{/* The brokers' CA from the component's Kafka Secret (.root, .component). */}}
{{- define "tiergate.kafkaCaVolume" -}}
{{- $sec := .root.Values.jobs.kafka.security -}}
{{- if and (ne $sec.protocol "PLAINTEXT") $sec.caKey }}
- name: kafka-ca
  secret:
    secretName: {{ include "tiergate.kafkaSecret" . }}
    items: [{key: {{ $sec.caKey }}, path: ca.crt}]
{{- end }}
{{- end -}}

{{- define "tiergate.kafkaCaMount" -}}
{{- $sec := .Values.jobs.kafka.security -}}
{{- if and (ne $sec.protocol "PLAINTEXT") $sec.caKey }}
- {name: kafka-ca, mountPath: /etc/tiergate/kafka, readOnly: true}
{{- end }}
{{- end -}}

{{/* Scheduling fields every pod spec takes the same way (.v: a component's values). */}}
{{- define "tiergate.scheduling" -}}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A secret the chart makes (.purpose: worker-api-key, engine-api-key, redis-password),
the same on every render (helm template, Argo CD, Flux): derived from secretSeed, or with
no seed the value already in the cluster's Secret (.secret, key .key; lookup finds it under
helm install/upgrade only), else rendering fails. Never random: a value made per render
would change on every sync, and the pods holding the old one would be refused. */}}
{{- define "tiergate.generated" -}}
{{- $root := .root -}}
{{- $seed := $root.Values.secretSeed | default "" -}}
{{- if $seed -}}
{{- .prefix | default "" -}}{{- sha256sum (printf "tiergate/%s/%s/%s/%s" $seed $root.Release.Namespace $root.Release.Name .purpose) -}}
{{- else -}}
{{- $existing := (lookup "v1" "Secret" $root.Release.Namespace .secret).data | default dict -}}
{{- $found := index $existing .key | default "" | b64dec -}}
{{- if not $found -}}
{{- fail (printf "%s (Secret %s, key %s) needs a source that is the same on every render: set secretSeed (at least 32 random characters, kept as secret as the keys: `openssl rand -hex 32`) to derive it, or name an existing Secret in %s. The chart does not generate it at random: under helm template (Argo CD, Flux) it would change on every render." .purpose .secret .key .existingValue) -}}
{{- end -}}
{{- $found -}}
{{- end -}}
{{- end -}}

{{- define "tiergate.workerKey" -}}
{{- include "tiergate.generated" (dict "root" . "purpose" "worker-api-key" "prefix" "tg-" "secret" (include "tiergate.authSecret" .) "key" "worker-api-key" "existingValue" "auth.existingSecret") -}}
{{- end -}}

{{- define "tiergate.engineKey" -}}
{{- include "tiergate.generated" (dict "root" . "purpose" "engine-api-key" "secret" (include "tiergate.engineSecret" .) "key" "engine-api-key" "existingValue" "vllm.apiKey.existingSecret") -}}
{{- end -}}

{{- define "tiergate.redisPassword" -}}
{{- include "tiergate.generated" (dict "root" . "purpose" "redis-password" "secret" (include "tiergate.redisSecret" .) "key" "redis-password" "existingValue" "redis.existingSecret") -}}
{{- end -}}

{{/* The chart's Redis password: redis.existingSecret, or the chart-made Secret. */}}
{{- define "tiergate.redisSecret" -}}
{{- .Values.redis.existingSecret | default (printf "%s-redis" (include "tiergate.fullname" .)) -}}
{{- end -}}

{{- define "tiergate.redisSecretKey" -}}
{{- if .Values.redis.existingSecret }}{{ .Values.redis.existingSecretKey }}{{ else }}redis-password{{ end -}}
{{- end -}}

{{/* A one-way digest of the chart-made secrets a pod reads from its environment at start
(engine key, Redis password), as a pod annotation: a changed secretSeed rolls those pods,
which would otherwise keep the old value. "" when the secret is not the chart's. */}}
{{- define "tiergate.secretsChecksum" -}}
{{- $root := .root -}}
{{- $parts := list -}}
{{- if and (has "engine" .uses) $root.Values.vllm.apiKey.enabled (not $root.Values.vllm.apiKey.existingSecret) -}}
{{- $parts = append $parts (include "tiergate.engineKey" $root) -}}
{{- end -}}
{{- if and (has "redis" .uses) (eq (include "tiergate.redisSource" $root) "chart") (not $root.Values.redis.existingSecret) -}}
{{- $parts = append $parts (include "tiergate.redisPassword" $root) -}}
{{- end -}}
{{- if $parts }}{{ join "/" $parts | sha256sum }}{{ end -}}
{{- end -}}

{{/* The gateway's NetworkPolicy peers for its API port (the workers', the helm test's,
the Ingress controller's, gateway.networkPolicy.from), as a YAML list. */}}
{{- define "tiergate.gatewayPeers" -}}
{{- $np := .Values.gateway.networkPolicy -}}
{{- $peers := list -}}
{{- if .Values.jobs.enabled -}}
{{- $peers = append $peers (dict "podSelector" (dict "matchLabels" (include "tiergate.selector" (dict "root" . "component" "worker") | fromYaml))) -}}
{{- end -}}
{{- $peers = append $peers (dict "podSelector" (dict "matchLabels" (include "tiergate.selector" (dict "root" . "component" "test") | fromYaml))) -}}
{{- if .Values.gateway.ingress.enabled -}}
{{- $peers = concat $peers ($np.ingressController | default list) -}}
{{- end -}}
{{- $peers = concat $peers ($np.from | default list) -}}
{{- toYaml $peers -}}
{{- end -}}
