import io.cloudevents.CloudEvent;
import io.cloudevents.SpecVersion;
import io.cloudevents.core.data.BytesCloudEventData;
import io.cloudevents.core.message.MessageReader;
import io.cloudevents.core.message.impl.BaseGenericBinaryMessageReaderImpl;
import io.cloudevents.core.message.impl.GenericStructuredMessageReader;
import io.cloudevents.core.message.impl.MessageUtils;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.function.BiConsumer;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.common.consumer.ConsumeFromWhere;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;

/**
 * The consumer the tests read through testsvc.ReadCloudEventsWithJava: it reads every message
 * of a topic with RocketMQ's Java client, from the first offset, and reads each as a
 * CloudEvent with the CloudEvents Java SDK (cloudevents-core), by the RocketMQ binding's
 * binary content mode.
 *
 * <p>Usage: java -cp CLASSPATH CloudEventsConsumer.java NAMESRV TOPIC GROUP COUNT SECONDS
 *
 * <p>It prints one JSON line per message on stdout, what the SDK read (or why it could not)
 * beside the message's own properties, and exits once COUNT distinct eventIds have come,
 * with 0, or after SECONDS, with 1.
 *
 * <p>The SDK's own RocketMQ module (io.cloudevents:cloudevents-rocketmq) is not what reads
 * them here: Maven Central as this project's machines reach it serves cloudevents-core but
 * not that module. {@link RocketMQBinaryReader} is the binding's reader written to the
 * binding (the draft in apache/rocketmq-externals, with the property names of that module's
 * RocketmqConstants): the SDK's core does the rest as it does for that module, from the
 * choice of the content mode (MessageUtils.parseStructuredOrBinaryMessage) to the
 * attributes' checks (CloudEventBuilder: id, source as a java.net.URI, type, time as an RFC
 * 3339 OffsetDateTime).
 */
public class CloudEventsConsumer {
    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: CloudEventsConsumer NAMESRV TOPIC GROUP COUNT SECONDS");
            System.exit(2);
        }
        String namesrv = args[0], topic = args[1], group = args[2];
        int want = Integer.parseInt(args[3]);
        long deadline = System.nanoTime() + Long.parseLong(args[4]) * 1_000_000_000L;

        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group);
        consumer.setNamesrvAddr(namesrv);
        consumer.setInstanceName(group);
        consumer.setConsumeFromWhere(ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.start();
        Set<String> seen = new HashSet<>();
        try {
            while (seen.size() < want && System.nanoTime() < deadline) {
                for (MessageExt m : consumer.poll(500)) {
                    seen.add(String.valueOf(m.getProperty("eventId")));
                    System.out.println(line(m));
                }
                System.out.flush();
            }
        } finally {
            consumer.shutdown();
        }
        if (seen.size() < want) {
            System.err.printf("%d of %d distinct events arrived%n", seen.size(), want);
            System.exit(1);
        }
    }

    /** line is the JSON line of one message. */
    static String line(MessageExt m) {
        Map<String, String> props = new HashMap<>(m.getProperties());
        props.keySet().removeIf(MessageConst.STRING_HASH_SET::contains);
        Map<String, Object> out = new TreeMap<>();
        out.put("msgId", m.getMsgId());
        out.put("eventId", props.get("eventId"));
        out.put("eventType", props.get("eventType"));
        out.put("bizNo", props.get("bizNo"));
        Map<String, Object> ce = new TreeMap<>();
        props.forEach((k, v) -> {
            if (k.startsWith("CE_")) {
                ce.put(k, v);
            }
        });
        out.put("ceProperties", ce);
        try {
            CloudEvent ev = RocketMQBinaryReader.reader(props, m.getBody()).toEvent();
            out.put("specversion", ev.getSpecVersion().toString());
            out.put("id", ev.getId());
            out.put("type", ev.getType());
            out.put("source", ev.getSource() == null ? null : ev.getSource().toString());
            if (ev.getTime() != null) {
                out.put("time", ev.getTime().toString());
                out.put("timeMillis", ev.getTime().toInstant().toEpochMilli());
            }
            out.put("datacontenttype", ev.getDataContentType());
            if (ev.getData() != null) {
                out.put("data", Base64.getEncoder().encodeToString(ev.getData().toBytes()));
            }
            out.put("extensions", new ArrayList<Object>(new TreeSet<>(ev.getExtensionNames())));
        } catch (RuntimeException e) {
            out.put("error", e.toString());
        }
        return json(out);
    }

    /** json writes strings, numbers, lists and maps of them as JSON. */
    static String json(Object v) {
        if (v == null) {
            return "null";
        }
        if (v instanceof Number) {
            return v.toString();
        }
        StringBuilder b = new StringBuilder();
        if (v instanceof Map) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    b.append(',');
                }
                first = false;
                b.append(json(String.valueOf(e.getKey()))).append(':').append(json(e.getValue()));
            }
            return b.append('}').toString();
        }
        if (v instanceof List) {
            b.append('[');
            boolean first = true;
            for (Object e : (List<?>) v) {
                if (!first) {
                    b.append(',');
                }
                first = false;
                b.append(json(e));
            }
            return b.append(']').toString();
        }
        String s = v.toString();
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }
}

/**
 * RocketMQBinaryReader reads a RocketMQ message's user properties and body as a CloudEvent, by
 * the RocketMQ binding: a CE_contenttype that names a CloudEvents event format means the
 * structured content mode; otherwise CE_specversion marks the binary content mode, in which
 * CE_contenttype is datacontenttype, every other CE_x property is attribute x, and the body
 * is the data.
 */
final class RocketMQBinaryReader extends BaseGenericBinaryMessageReaderImpl<String, String> {
    static final String PREFIX = "CE_";
    static final String CONTENT_TYPE = "CE_contenttype";
    static final String SPEC_VERSION = "CE_specversion";

    private final Map<String, String> properties;

    private RocketMQBinaryReader(SpecVersion version, Map<String, String> properties, byte[] body) {
        super(version, body == null || body.length == 0 ? null : BytesCloudEventData.wrap(body));
        this.properties = properties;
    }

    /** reader returns the reader of a message with these user properties and body. */
    static MessageReader reader(Map<String, String> properties, byte[] body) {
        return MessageUtils.parseStructuredOrBinaryMessage(
            () -> properties.get(CONTENT_TYPE),
            format -> new GenericStructuredMessageReader(format, body),
            () -> properties.get(SPEC_VERSION),
            version -> new RocketMQBinaryReader(version, properties, body));
    }

    @Override
    protected boolean isContentTypeHeader(String key) {
        return CONTENT_TYPE.equals(key);
    }

    @Override
    protected boolean isCloudEventsHeader(String key) {
        return key.startsWith(PREFIX) && key.length() > PREFIX.length();
    }

    @Override
    protected String toCloudEventsKey(String key) {
        return key.substring(PREFIX.length());
    }

    @Override
    protected void forEachHeader(BiConsumer<String, String> fn) {
        properties.forEach(fn);
    }

    @Override
    protected String toCloudEventsValue(String value) {
        return value;
    }
}
