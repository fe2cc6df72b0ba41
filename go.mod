module github.com/gopipeline/pipeline

go 1.26.8

require golang.org/x/sync v0.25.0
