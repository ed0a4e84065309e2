package testsvc

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

// The broker's remoting codes for a query by message key (RocketMQ's RequestCode
// QUERY_MESSAGE and ResponseCode QUERY_NOT_FOUND).
const (
	reqQueryMessage   = 12
	respSuccess       = 0
	respQueryNotFound = 22
)

// QueryByKey asks the broker (as mqadmin queryMsgByKey does) whether its index holds a
// message of topic under key, the way a person looks an order's messages up. The Go client
// has no such call, so this speaks the broker's remoting protocol: a frame of the total
// length, the JSON header's length, the header. Call it from the test's goroutine first
// (it skips or fails t without a broker); the error is the query's own.
func QueryByKey(t testing.TB, topic, key string) (bool, error) {
	t.Helper()
	RocketMQNameServer(t)
	conn, err := net.DialTimeout("tcp", brokerAddr(), 5*time.Second)
	if err != nil {
		return false, fmt.Errorf("query by key: %w", err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(15 * time.Second))
	header, err := json.Marshal(map[string]any{
		"code": reqQueryMessage, "language": "GO", "version": 317, "opaque": 1, "flag": 0,
		"extFields": map[string]string{
			"topic": topic, "key": key, "maxNum": "32", "beginTimestamp": "0",
			"endTimestamp": strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10),
		},
	})
	if err != nil {
		return false, fmt.Errorf("query by key: %w", err)
	}
	frame := binary.BigEndian.AppendUint32(nil, uint32(4+len(header)))
	frame = binary.BigEndian.AppendUint32(frame, uint32(len(header))) // serialize type 0: JSON
	frame = append(frame, header...)
	if _, err := conn.Write(frame); err != nil {
		return false, fmt.Errorf("query by key: %w", err)
	}
	var lengths [8]byte
	if _, err := io.ReadFull(conn, lengths[:]); err != nil {
		return false, fmt.Errorf("query by key: read the answer: %w", err)
	}
	total := binary.BigEndian.Uint32(lengths[:4])
	headerLen := binary.BigEndian.Uint32(lengths[4:]) & 0xffffff
	if total < 4+headerLen || total > 64<<20 {
		return false, fmt.Errorf("query by key: a frame of %d bytes with a header of %d", total, headerLen)
	}
	rest := make([]byte, total-4)
	if _, err := io.ReadFull(conn, rest); err != nil {
		return false, fmt.Errorf("query by key: read the answer: %w", err)
	}
	var answer struct {
		Code   int    `json:"code"`
		Remark string `json:"remark"`
	}
	if err := json.Unmarshal(rest[:headerLen], &answer); err != nil {
		return false, fmt.Errorf("query by key: the answer's header %q: %w", rest[:headerLen], err)
	}
	switch answer.Code {
	case respSuccess:
		return len(rest) > int(headerLen), nil
	case respQueryNotFound:
		return false, nil
	}
	return false, fmt.Errorf("query by key: the broker answered code %d: %s", answer.Code, answer.Remark)
}
