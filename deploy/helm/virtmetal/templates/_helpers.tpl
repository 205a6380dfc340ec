{{/*
virtmetal.image: an image of `make images`, PREFIX/NAME:TAG.
Called with (list $ "NAME").
*/}}
{{- define "virtmetal.image" -}}
{{- $root := index . 0 -}}
{{- printf "%s/%s:%s" $root.Values.image.prefix (index . 1) ($root.Values.image.tag | default $root.Chart.AppVersion) -}}
{{- end -}}

{{/*
virtmetal.matchLabels: the namespaceSelector value, label=value pairs
comma-separated, as the matchLabels of a LabelSelector (YAML).
*/}}
{{- define "virtmetal.matchLabels" -}}
{{- $labels := dict -}}
{{- range splitList "," . -}}
{{- $pair := splitn "=" 2 . -}}
{{- $_ := set $labels $pair._0 $pair._1 -}}
{{- end -}}
{{- toYaml $labels -}}
{{- end -}}
