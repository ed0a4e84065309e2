package rmqlock

import (
	"encoding/json"
	"fmt"
)

// unmarshal decodes RocketMQ's JSON into v. The servers serialize with fastjson, which
// writes the keys of a map with integer keys as bare numbers ({"brokerAddrs":{0:"..."}});
// unmarshal quotes those keys and leaves every other byte as it is, so that a bare number
// inside a string, or a number that is a value, is never touched.
func unmarshal(data []byte, v any) error {
	std, err := standardJSON(data)
	if err != nil {
		return err
	}
	return json.Unmarshal(std, v)
}

// standardJSON returns data with each object key written as a bare number quoted. It
// scans the text as JSON does: strings with their escapes, and the nesting of objects and
// arrays, a key being expected after an object's "{" and after each "," in it.
func standardJSON(data []byte) ([]byte, error) {
	out := make([]byte, 0, len(data)+16)
	var nest []byte // '{' or '[' for each open object or array
	key := false    // the next token is an object's key
	for i := 0; i < len(data); i++ {
		c := data[i]
		switch {
		case c == '"':
			end, err := stringEnd(data, i)
			if err != nil {
				return nil, err
			}
			out = append(out, data[i:end]...)
			i = end - 1
			key = false
		case key && (c == '-' || c >= '0' && c <= '9'):
			j := i + 1
			for j < len(data) && data[j] >= '0' && data[j] <= '9' {
				j++
			}
			out = append(append(append(out, '"'), data[i:j]...), '"')
			i = j - 1
			key = false
		default:
			switch c {
			case '{':
				nest = append(nest, c)
				key = true
			case '[':
				nest = append(nest, c)
			case '}', ']':
				if len(nest) == 0 {
					return nil, fmt.Errorf("rmqlock: decode a response: unbalanced %q at offset %d", c, i)
				}
				nest = nest[:len(nest)-1]
			case ',':
				key = len(nest) > 0 && nest[len(nest)-1] == '{'
			}
			out = append(out, c)
		}
	}
	return out, nil
}

// stringEnd returns the offset just past the string that starts at data[i] (a '"').
func stringEnd(data []byte, i int) (int, error) {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("rmqlock: decode a response: unterminated string at offset %d", i)
}
