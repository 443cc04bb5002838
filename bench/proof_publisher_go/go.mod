module nsqtw.invalid/proofpublisher

go 1.17

require github.com/nsqio/go-nsq v1.1.0
