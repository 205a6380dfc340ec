module github.com/virtmetal/virtmetal

go 1.26
