package controllers

import "errors"

var (
	errHostNotAllowed = errors.New("ingress host not allowed")
	errHostTaken      = errors.New("ingress host taken")
)
