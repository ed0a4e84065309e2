package rmqlock

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The servers' integer map keys are quoted; numbers that are values, and text inside
// strings that looks like a key, are left as they are.
func TestStandardJSON(t *testing.T) {
	for in, want := range map[string]string{
		`{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10912"}}`:    `{"brokerAddrs":{"0":"127.0.0.1:10911","1":"127.0.0.1:10912"}}`,
		`{ -1 : "a" , 2:[1,2,{3:4}]}`:                                  `{ "-1" : "a" , "2":[1,2,{"3":4}]}`,
		`{"remark":"{0:\"x\",1:2}","n":[0,1]}`:                         `{"remark":"{0:\"x\",1:2}","n":[0,1]}`,
		`{"a":"\\",1:"b"}`:                                             `{"a":"\\","1":"b"}`,
		`[{"queueId":3,"brokerName":"broker-a"},{"queueId":4}]`:        `[{"queueId":3,"brokerName":"broker-a"},{"queueId":4}]`,
		`{"lockOKMQSet":[{"topic":"T","brokerName":"b","queueId":0}]}`: `{"lockOKMQSet":[{"topic":"T","brokerName":"b","queueId":0}]}`,
	} {
		got, err := standardJSON([]byte(in))
		require.NoError(t, err, in)
		assert.Equal(t, want, string(got), in)
		assert.True(t, json.Valid(got), "valid JSON: %s", got)
	}
	for _, bad := range []string{`{"a":"b`, `{"a":1}}`, `]`} {
		_, err := standardJSON([]byte(bad))
		assert.Error(t, err, bad)
	}
}

// The protocol version is the one the Go client sends, read from the client's source in
// the module cache.
func TestProtocolVersionIsTheGoClients(t *testing.T) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/apache/rocketmq-client-go/v2").Output()
	require.NoError(t, err)
	src, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(out)), "internal", "remote", "codec.go"))
	require.NoError(t, err)
	m := regexp.MustCompile(`_Version\s*=\s*(\d+)`).FindSubmatch(src)
	require.NotNil(t, m, "the client's codec.go names its version")
	v, err := strconv.Atoi(string(m[1]))
	require.NoError(t, err)
	assert.Equal(t, v, protocolVersion)
}
