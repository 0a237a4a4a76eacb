{{/*
Names and labels. Kubernetes takes names and label values of 63 characters at most that end in
a letter or digit: each is cut to 63 (the fullname to 58, leaving room for "-mesh") and loses a
trailing "-" (a label value also a "_" or "."), as Helm's own scaffold does. The fullname names
Services, which take no "." (a DNS label), though a release name may have some: each becomes "-".
*/}}
{{- define "kvmesh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvmesh.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | replace "." "-" | trunc 58 | trimAll "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | replace "." "-" | trunc 58 | trimAll "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | replace "." "-" | trunc 58 | trimAll "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kvmesh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvmesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "kvmesh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvmesh.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | replace "+" "_" | trunc 63 | trimAll "-_." | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvmesh
{{- end -}}

{{- define "kvmesh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvmesh.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kvmesh.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* The headless Service whose DNS name lists every pod, ready or not: the gossip seeds. */}}
{{- define "kvmesh.meshService" -}}
{{- printf "%s-mesh" (include "kvmesh.fullname" .) -}}
{{- end -}}

{{- define "kvmesh.join" -}}
{{- printf "%s.%s.svc.%s:%d" (include "kvmesh.meshService" .) .Release.Namespace .Values.clusterDomain (int .Values.ports.gossip) -}}
{{- end -}}

{{/*
The admin listener's port, 0 when off: ports.admin, else 9090 while a ServiceMonitor scrapes a
node with an API key file, for the API port then answers /metrics 401 to it, which has no key
to send. Not otherwise: the listener answers anyone who reaches the pod without a key.
*/}}
{{- define "kvmesh.adminPort" -}}
{{- if .Values.ports.admin -}}
{{- int .Values.ports.admin -}}
{{- else if and .Values.node.apiKeys.existingSecret .Values.serviceMonitor.enabled -}}
9090
{{- else -}}
0
{{- end -}}
{{- end -}}

{{- define "kvmesh.engineURL" -}}
{{- if .Values.node.engine -}}
{{- .Values.node.engine -}}
{{- else if eq .Values.mode "sidecar" -}}
http://127.0.0.1:8000
{{- else -}}
http://$(HOST_IP):8000
{{- end -}}
{{- end -}}

{{/* Checks of values the schema cannot express. */}}
{{- define "kvmesh.validate" -}}
{{- /* The stop: the preStop sleep and a 2 s drain delay (peers hear of it by gossip), else the
node's own 5 s drain delay; the drain; a second for the requests the drain cuts to say so; a
second to leave the mesh. */ -}}
{{- $grace := int .Values.terminationGracePeriodSeconds -}}
{{- $unready := add (int .Values.preStopSleepSeconds) 2 -}}
{{- if eq (int .Values.preStopSleepSeconds) 0 }}{{ $unready = 5 }}{{ end -}}
{{- $need := add (int .Values.node.drainTimeoutSeconds) $unready 2 -}}
{{- if le $grace (int $need) -}}
{{- fail (printf "terminationGracePeriodSeconds (%d) must exceed the stop's %d s: preStopSleepSeconds + 2 (or the node's 5 s drain delay without one) + node.drainTimeoutSeconds + 2 (the cut requests' second and the leave), or the kubelet kills nodes mid-drain" $grace (int $need)) -}}
{{- end -}}
{{- if and (eq .Values.mode "sidecar") (not .Values.sidecar.engine) -}}
{{- fail "mode sidecar needs sidecar.engine: the engine's container" -}}
{{- end -}}
{{- if not .Values.gossip.existingSecret -}}
{{- fail "gossip.existingSecret is required: a Secret with the mesh's gossip key" -}}
{{- end -}}
{{- if not .Values.tls.existingSecret -}}
{{- fail "tls.existingSecret is required: a Secret with ca.crt and the node certificate" -}}
{{- end -}}
{{- $admin := include "kvmesh.adminPort" . | int -}}
{{- if and $admin (or (eq $admin (int .Values.ports.http)) (eq $admin (int .Values.ports.gossip))) -}}
{{- fail (printf "ports.admin (%d) must differ from ports.http and ports.gossip: both are TCP listeners" $admin) -}}
{{- end -}}
{{- if and $admin (eq .Values.mode "sidecar") -}}
{{- range .Values.sidecar.engine.ports -}}
{{- if or (eq (int .containerPort) $admin) (eq (toString .name) "admin") -}}
{{- fail (printf "ports.admin (%d) clashes with the sidecar engine's port %v (%v): kvmesh and the engine share the pod" $admin .containerPort (.name | default "unnamed")) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
The init container: copies ca.crt and this node's certificate and key from the TLS Secret into
an in-memory volume under the names kvmesh loads (NAME.crt, NAME.key for --name), taking
NAME.crt from the Secret when it has one and tls.crt otherwise. It refuses a Secret with ca.key.
*/}}
{{- define "kvmesh.tlsInitContainer" -}}
- name: tls
  image: {{ include "kvmesh.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - /bin/sh
    - -ec
    - |
      src=/etc/kvmesh/tls-secret dst=/run/kvmesh/tls
      if [ -e "$src/ca.key" ]; then
        echo "the TLS Secret holds ca.key: give nodes only ca.crt and their own certificate" >&2
        exit 1
      fi
      name=tls
      if [ -f "$src/$KVMESH_NAME.crt" ]; then name=$KVMESH_NAME; fi
      cp "$src/ca.crt" "$dst/ca.crt"
      cp "$src/$name.crt" "$dst/$KVMESH_NAME.crt"
      cp "$src/$name.key" "$dst/$KVMESH_NAME.key"
      chmod 0444 "$dst/ca.crt" "$dst/$KVMESH_NAME.crt"
      chmod 0400 "$dst/$KVMESH_NAME.key"
  env:
    {{- include "kvmesh.nameEnv" . | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: tls-secret
      mountPath: /etc/kvmesh/tls-secret
      readOnly: true
    - name: tls
      mountPath: /run/kvmesh/tls
{{- end -}}

{{/* --name: the Kubernetes node's name in daemonset mode, the pod's in sidecar mode. */}}
{{- define "kvmesh.nameEnv" -}}
- name: KVMESH_NAME
  valueFrom:
    fieldRef:
      fieldPath: {{ if eq .Values.mode "sidecar" }}metadata.name{{ else }}spec.nodeName{{ end }}
{{- end -}}

{{/* The kvmesh container, the same in both modes. */}}
{{- define "kvmesh.container" -}}
- name: kvmesh
  image: {{ include "kvmesh.image" . }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  args:
    - node
    {{- range .Values.node.extraArgs }}
    - {{ . | quote }}
    {{- end }}
  env:
    - name: POD_IP
      valueFrom:
        fieldRef:
          fieldPath: status.podIP
    - name: HOST_IP
      valueFrom:
        fieldRef:
          fieldPath: status.hostIP
    {{- include "kvmesh.nameEnv" . | nindent 4 }}
    - name: KVMESH_ADVERTISE
      value: $(POD_IP)
    - name: KVMESH_JOIN
      value: {{ include "kvmesh.join" . | quote }}
    - name: KVMESH_HTTP
      value: {{ printf ":%d" (int .Values.ports.http) | quote }}
    {{- with include "kvmesh.adminPort" . | int }}
    - name: KVMESH_ADMIN_ADDR
      value: {{ printf ":%d" . | quote }}
    {{- end }}
    - name: KVMESH_GOSSIP
      value: {{ printf ":%d" (int .Values.ports.gossip) | quote }}
    - name: KVMESH_QUIC
      value: {{ printf ":%d" (int .Values.ports.quic) | quote }}
    - name: KVMESH_TLS_DIR
      value: /run/kvmesh/tls
    - name: KVMESH_GOSSIP_KEY
      valueFrom:
        secretKeyRef:
          name: {{ .Values.gossip.existingSecret }}
          key: {{ .Values.gossip.key }}
    - name: KVMESH_ENGINE
      value: {{ include "kvmesh.engineURL" . | quote }}
    - name: KVMESH_ENGINE_KIND
      value: {{ .Values.node.engineKind | quote }}
    {{- with .Values.node.models }}
    - name: KVMESH_MODEL
      value: {{ join "," . | quote }}
    {{- end }}
    {{- if .Values.node.enginePriority }}
    - name: KVMESH_ENGINE_PRIORITY
      value: "true"
    {{- end }}
    - name: KVMESH_DRAIN_TIMEOUT
      value: {{ printf "%ds" (int .Values.node.drainTimeoutSeconds) | quote }}
    {{- if gt (int .Values.preStopSleepSeconds) 0 }}
    # The preStop sleep kept the pod serving while it left the endpoints; the node's delay
    # need only be long enough for its peers to hear it is going (a state record or two).
    - name: KVMESH_DRAIN_DELAY
      value: "2s"
    {{- end }}
    - name: KVMESH_GPU
      value: {{ .Values.node.gpu | quote }}
    - name: KVMESH_LOG_LEVEL
      value: {{ .Values.node.logLevel | quote }}
    - name: KVMESH_LOG_FORMAT
      value: {{ .Values.node.logFormat | quote }}
    {{- if .Values.node.config }}
    - name: KVMESH_CONFIG
      value: /etc/kvmesh/config/config.json
    {{- end }}
    {{- if .Values.node.apiKeys.existingSecret }}
    - name: KVMESH_API_KEYS
      value: {{ printf "/etc/kvmesh/keys/%s" .Values.node.apiKeys.key | quote }}
    {{- end }}
    {{- if .Values.gpuTelemetry.enabled }}
    - name: NVIDIA_VISIBLE_DEVICES
      value: all
    - name: NVIDIA_DRIVER_CAPABILITIES
      value: utility
    {{- end }}
    {{- with .Values.node.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  ports:
    - name: http
      containerPort: {{ .Values.ports.http }}
      protocol: TCP
    {{- with include "kvmesh.adminPort" . | int }}
    - name: admin
      containerPort: {{ . }}
      protocol: TCP
    {{- end }}
    - name: gossip
      containerPort: {{ .Values.ports.gossip }}
      protocol: TCP
    - name: gossip-udp
      containerPort: {{ .Values.ports.gossip }}
      protocol: UDP
    - name: quic
      containerPort: {{ .Values.ports.quic }}
      protocol: UDP
  readinessProbe:
    httpGet:
      path: /readyz
      port: http
    {{- toYaml .Values.probes.readiness | nindent 4 }}
  livenessProbe:
    httpGet:
      path: /healthz
      port: http
    {{- toYaml .Values.probes.liveness | nindent 4 }}
  {{- if gt (int .Values.preStopSleepSeconds) 0 }}
  lifecycle:
    preStop:
      exec:
        command: ["/bin/sleep", {{ .Values.preStopSleepSeconds | quote }}]
  {{- end }}
  resources:
    {{- toYaml .Values.resources | nindent 4 }}
  securityContext:
    {{- toYaml .Values.securityContext | nindent 4 }}
  volumeMounts:
    - name: tls
      mountPath: /run/kvmesh/tls
      readOnly: true
    - name: tmp
      mountPath: /tmp
    {{- if .Values.node.config }}
    - name: config
      mountPath: /etc/kvmesh/config
      readOnly: true
    {{- end }}
    {{- if .Values.node.apiKeys.existingSecret }}
    - name: api-keys
      mountPath: /etc/kvmesh/keys
      readOnly: true
    {{- end }}
    {{- with .Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* The pod spec both workloads share: dict "root" $ "extra" CONTAINER (the engine, or nil). */}}
{{- define "kvmesh.podSpec" -}}
{{- $root := .root -}}
serviceAccountName: {{ include "kvmesh.serviceAccountName" $root }}
automountServiceAccountToken: false
terminationGracePeriodSeconds: {{ $root.Values.terminationGracePeriodSeconds }}
{{- if and $root.Values.gpuTelemetry.enabled $root.Values.gpuTelemetry.runtimeClassName }}
runtimeClassName: {{ $root.Values.gpuTelemetry.runtimeClassName }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- if and (eq $root.Values.mode "daemonset") $root.Values.daemonset.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
initContainers:
  {{- include "kvmesh.tlsInitContainer" $root | nindent 2 }}
containers:
  {{- include "kvmesh.container" $root | nindent 2 }}
  {{- with .extra }}
  {{- toYaml (list .) | nindent 2 }}
  {{- end }}
{{- with $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
volumes:
  - name: tls-secret
    secret:
      secretName: {{ $root.Values.tls.existingSecret }}
      defaultMode: 0440
  - name: tls
    emptyDir:
      medium: Memory
      sizeLimit: 1Mi
  - name: tmp
    emptyDir:
      sizeLimit: 64Mi
  {{- if $root.Values.node.config }}
  - name: config
    configMap:
      name: {{ include "kvmesh.fullname" $root }}
  {{- end }}
  {{- if $root.Values.node.apiKeys.existingSecret }}
  - name: api-keys
    secret:
      secretName: {{ $root.Values.node.apiKeys.existingSecret }}
      defaultMode: 0440
  {{- end }}
  {{- with $root.Values.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end -}}

{{- define "kvmesh.podMetadata" -}}
labels:
  {{- include "kvmesh.selectorLabels" . | nindent 2 }}
  app.kubernetes.io/part-of: kvmesh
  {{- with .Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- if or .Values.node.config .Values.podAnnotations }}
annotations:
  {{- if .Values.node.config }}
  checksum/config: {{ toJson .Values.node.config | sha256sum }}
  {{- end }}
  {{- with .Values.podAnnotations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
{{- end -}}
