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
